"""Linear strategies: a streaming mean of deltas followed by a per-tensor server step.

Subclasses supply only the numeric kernel (``_step``) and the names of their state slots;
this module owns the lifecycle around it: structure checks, float64 arithmetic, casting back
to each tensor's dtype, integer tensors, and exception-safe state updates (the new state is
committed only after every tensor stepped cleanly, so a failed ``apply`` changes nothing;
the price is holding old and new state together for a moment).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.strategies._numeric import (
    F64Array,
    add_integer,
    blocks,
    flat,
    is_integer,
    to_dtype,
)
from geofl.server.strategies.base import Strategy
from geofl.server.strategies.errors import StrategyError
from geofl.server.strategies.streaming import StreamingMean

__all__ = ["ServerOptStrategy", "check_range"]

_TensorState = dict[str, F64Array]


class ServerOptStrategy(Strategy):
    """Streaming mean of client deltas plus a float64 server-side step per float tensor.

    Integer tensors (e.g. batch-norm counters) take ``w + round(mean_delta)`` and carry no
    optimizer state. The state of float tensor ``t`` in slot ``s`` is published by
    :meth:`state` under the key ``"s/t"``.

    Attributes
    ----------
    slots
        Names of the per-tensor state slots (``()`` for a stateless strategy).
    """

    slots: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._state: dict[str, _TensorState] = {}

    def hyperparameters(self) -> Config:
        """Return the strategy's hyperparameters, e.g. for the run record."""
        return {}

    def __repr__(self) -> str:
        params = ", ".join(f"{key}={value!r}" for key, value in self.hyperparameters().items())
        return f"{type(self).__name__}({params})"

    def begin_round(self, global_weights: WeightsView) -> StreamingMean:
        """Return an accumulator shaped like ``global_weights`` (keeps no reference to them)."""
        self._check_state_matches(global_weights)
        return StreamingMean(global_weights)

    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """Step every tensor from ``mean_delta``; return new arrays in the global dtypes.

        Raises
        ------
        StrategyError
            If ``mean_delta`` or the optimizer state does not match ``global_weights``, the
            round is not a positive integer, or a result is not finite. State is unchanged.
        """
        _check_round(server_round)
        _check_same_structure(global_weights, mean_delta)
        self._check_state_matches(global_weights)
        new_weights: Weights = {}
        new_state: dict[str, _TensorState] = {}
        for name, weights in global_weights.items():
            delta = np.asarray(mean_delta[name])
            if is_integer(weights.dtype):
                new_weights[name] = add_integer(weights, delta, name)
                continue
            current = self._state.get(name) or self._zeros(weights.shape)
            new_weights[name], new_state[name] = self._step_blocks(
                name, weights, delta, current, server_round
            )
        if self.slots:
            self._state = new_state
        return new_weights

    def state(self) -> Weights:
        """Return float64 copies of the optimizer state, keyed ``"slot/tensor"``."""
        return {
            f"{slot}/{name}": arrays[slot].copy()
            for name, arrays in self._state.items()
            for slot in self.slots
        }

    def load_state(self, state: WeightsView) -> None:
        """Replace the optimizer state with copies of ``state`` (``{}`` resets it).

        The slots are checked here (known slot names, every slot present for every tensor,
        equal shapes, finite floats); the tensor names and shapes are checked against the
        model at the next :meth:`begin_round` or :meth:`apply`.

        Raises
        ------
        StrategyError
            If ``state`` is malformed; the current state is then kept.
        """
        grouped: dict[str, _TensorState] = {}
        for key, value in state.items():
            slot, sep, name = key.partition("/")
            if not sep or slot not in self.slots:
                raise StrategyError(
                    f"{self.name}: unexpected state key {key!r}; expected 'slot/tensor' "
                    f"with slot in {list(self.slots)}"
                )
            grouped.setdefault(name, {})[slot] = _state_array(key, value)
        for name, arrays in grouped.items():
            _check_slots(name, arrays, self.slots)
        self._state = grouped

    def _step_blocks(
        self,
        name: str,
        weights: npt.NDArray[Any],
        delta: npt.NDArray[Any],
        current: _TensorState,
        server_round: int,
    ) -> tuple[npt.NDArray[Any], _TensorState]:
        """Step one tensor block by block: every kernel is elementwise, and float64
        temporaries of a whole large tensor would cost several times the model."""
        result = np.empty(weights.shape, dtype=weights.dtype)
        fresh = {slot: np.empty(weights.shape, dtype=np.float64) for slot in self.slots}
        w, d, out = flat(weights), flat(delta), result.reshape(-1)
        for part in blocks(w.size):
            state = {slot: array.reshape(-1)[part] for slot, array in current.items()}
            increment, stepped = self._step(d[part].astype(np.float64), state, server_round)
            out[part] = to_dtype(w[part].astype(np.float64) + increment, weights.dtype, name)
            for slot in self.slots:
                fresh[slot].reshape(-1)[part] = stepped[slot]
        return result, fresh

    def _zeros(self, shape: tuple[int, ...]) -> _TensorState:
        """Return fresh all-zero state for one tensor (the first round's starting point)."""
        return {slot: np.zeros(shape, dtype=np.float64) for slot in self.slots}

    def _check_state_matches(self, global_weights: WeightsView) -> None:
        """Refuse to step a model whose float tensors differ from the optimizer state's."""
        if not self._state:
            return
        floats = {n: w.shape for n, w in global_weights.items() if not is_integer(w.dtype)}
        if set(floats) != set(self._state):
            raise StrategyError(
                f"{self.name}: optimizer state covers tensors {sorted(self._state)}, "
                f"but the model's float tensors are {sorted(floats)}"
            )
        for name, shape in floats.items():
            got = next(iter(self._state[name].values())).shape
            if got != shape:
                raise StrategyError(
                    f"{self.name}: state of tensor {name!r} has shape {got}, model has {shape}"
                )

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, _TensorState]:
        """Return ``(increment, new_state)`` for one float tensor; must not mutate ``state``.

        The default is plain FedAvg with a unit server learning rate.
        """
        return delta, {}


def check_range(
    name: str, value: float, low: float, high: float, *, low_open: bool, high_open: bool
) -> float:
    """Return ``value`` as float if it lies in the given interval, else raise ValueError."""
    number = float(value)
    below = number <= low if low_open else number < low
    above = number >= high if high_open else number > high
    if math.isnan(number) or below or above:
        left = "(" if low_open else "["
        right = ")" if high_open else "]"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}, got {value!r}")
    return number


def _check_round(server_round: int) -> None:
    """Rounds are numbered from 1, as in Flower (FedAdam's bias correction depends on it)."""
    if isinstance(server_round, bool) or not isinstance(server_round, int) or server_round < 1:
        raise StrategyError(f"server_round must be an integer >= 1, got {server_round!r}")


def _check_same_structure(global_weights: WeightsView, mean_delta: WeightsView) -> None:
    """Refuse a mean delta whose tensor names or shapes differ from the model's."""
    if set(global_weights) != set(mean_delta):
        missing = sorted(set(global_weights) - set(mean_delta))
        unexpected = sorted(set(mean_delta) - set(global_weights))
        raise StrategyError(
            f"mean delta differs from the model: missing {missing}, unexpected {unexpected}"
        )
    for name, weights in global_weights.items():
        got = np.shape(mean_delta[name])
        if got != weights.shape:
            raise StrategyError(
                f"mean delta of tensor {name!r} has shape {got}, model has {weights.shape}"
            )


def _state_array(key: str, value: npt.NDArray[Any]) -> F64Array:
    """Return a float64 copy of one saved state tensor, refusing non-float or non-finite."""
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise StrategyError(f"state {key!r}: expected a float dtype, got {array.dtype}")
    if not bool(np.isfinite(array).all()):
        raise StrategyError(f"state {key!r}: expected finite values")
    return np.array(array, dtype=np.float64, copy=True)


def _check_slots(name: str, arrays: _TensorState, slots: tuple[str, ...]) -> None:
    """Require every slot for tensor ``name``, all of one shape."""
    missing = [slot for slot in slots if slot not in arrays]
    if missing:
        raise StrategyError(f"state of tensor {name!r} lacks slots {missing}")
    shapes = {arrays[slot].shape for slot in slots}
    if len(shapes) != 1:
        raise StrategyError(f"state slots of tensor {name!r} differ in shape: {sorted(shapes)}")
