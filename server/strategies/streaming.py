"""Streaming weighted mean of client deltas: server memory O(model), not O(clients x model).

Each update is folded into float64 running sums the moment it arrives, and nothing of it is
kept afterwards. Validation is all-or-nothing: an update is checked in full (names, exact
shapes, dtypes, finite values, a positive weight) before its first tensor is folded, so a
rejected update leaves the accumulator exactly as it was.

The update may be a lazily-read mapping (tensors decoded from a stream or a file on each
``update[name]``). Checking everything before folding therefore reads each tensor twice:
once to validate, once to fold. We chose that over a single pass with roll-back, because
subtracting a folded tensor again does not restore float sums bit for bit. The mapping must
return the same values on both reads.

Thread safety: ``add`` may be called from several threads; validation (which reads and
decodes) runs in parallel, folding is serialized by a lock.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from geofl.protocols.types import Weights, WeightsView
from geofl.server.strategies._numeric import F64Array, blocks, delta_dtype, flat, to_dtype
from geofl.server.strategies.checks import UpdateCheck
from geofl.server.strategies.errors import StrategyError, UpdateRejected

__all__ = ["StreamingMean", "TensorSpecLike"]


class TensorSpecLike(Protocol):
    """Anything with a dtype and a shape; a NumPy array is one."""

    @property
    def dtype(self) -> np.dtype[Any]:
        """Element type of the global tensor."""
        ...

    @property
    def shape(self) -> tuple[int, ...]:
        """Exact shape every update of this tensor must have."""
        ...


@dataclass(frozen=True)
class _Slot:
    """What the accumulator keeps per tensor: the expected shape and the running sum."""

    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    total: F64Array


class StreamingMean:
    """Running weighted mean of deltas for one round.

    Parameters
    ----------
    spec
        Tensor name -> dtype and shape of the global model, in model order (the global
        weights themselves will do). Only the metadata is kept.

    Attributes
    ----------
    count
        Number of updates folded in so far.
    total_weight
        Sum of their weights (usually ``num_examples``).
    """

    def __init__(self, spec: Mapping[str, TensorSpecLike]) -> None:
        self._slots: dict[str, _Slot] = {}
        for name, tensor in spec.items():
            dtype = np.dtype(tensor.dtype)
            delta_dtype(dtype, name)  # refuse bool/complex/object tensors up front
            shape = tuple(int(d) for d in tensor.shape)
            self._slots[name] = _Slot(dtype, shape, np.zeros(shape, dtype=np.float64))
        self.count = 0
        self.total_weight = 0.0
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in model order."""
        return tuple(self._slots)

    def add(self, update: WeightsView, weight: float) -> UpdateCheck | None:
        """Fold one client delta, weighted by ``weight``, into the running sums.

        Reads each ``update[name]`` exactly twice, in spec order: first to validate the
        whole update, then to fold it (see the module docstring for why).

        Returns
        -------
        UpdateCheck | None
            What a robust rule made of the update (None here: the plain mean uses it as
            it is). The engine records its reason with the client's participation.

        Raises
        ------
        UpdateRejected
            If the weight is not a finite positive number, the names differ from the spec,
            or a tensor has the wrong shape, a non-numeric dtype or a non-finite value
            (also when multiplying by ``weight`` would overflow). Nothing is folded then.
        """
        self.fold(update, self.validate(update, weight))
        return None

    def validate(self, update: WeightsView, weight: float) -> float:
        """Check one whole update (names, shapes, dtypes, finite values); return the weight.

        Raises
        ------
        UpdateRejected
            As :meth:`add`; reads every tensor once.
        """
        factor = _check_weight(weight)
        self._check_names(update)
        for name, slot in self._slots.items():
            _check_tensor(name, slot, update[name], factor)
        return factor

    def fold(self, update: WeightsView, weight: float, float_scale: float = 1.0) -> None:
        """Fold an update :meth:`validate` accepted: float tensors count ``weight *
        float_scale``, integer tensors ``weight``; the total weight grows by ``weight``.

        ``float_scale`` is how a norm bound shrinks an update without touching integer
        counters (a clipped update still counts as one whole client in the mean).
        """
        with self._lock:
            for name, slot in self._slots.items():
                values, total = flat(np.asarray(update[name])), slot.total.reshape(-1)
                factor = weight * float_scale if slot.dtype.kind == "f" else weight
                for part in blocks(values.size):
                    total[part] += np.multiply(values[part], factor, dtype=np.float64)
            self.count += 1
            self.total_weight += weight

    def close(self) -> None:
        """Free what the accumulator holds outside memory (nothing here; spilled rules
        remove their files). Safe to call more than once."""

    def mean(self) -> Weights:
        """Return the weighted mean delta, each tensor in its own dtype.

        Integer tensors are rounded; unsigned ones come back in the signed type of the same
        width, because their mean delta may be negative.

        Raises
        ------
        StrategyError
            If no update was added, or a float tensor's mean overflows its dtype (integer
            means are clipped to the dtype's range).
        """
        with self._lock:
            if self.count == 0:
                raise StrategyError("cannot take the mean of zero updates")
            result: Weights = {}
            for name, slot in self._slots.items():
                dtype = delta_dtype(slot.dtype, name)
                out = np.empty(slot.shape, dtype=dtype)
                total, target = slot.total.reshape(-1), out.reshape(-1)
                for part in blocks(total.size):
                    target[part] = to_dtype(total[part] / self.total_weight, dtype, name)
                result[name] = out
            return result

    def _check_names(self, update: WeightsView) -> None:
        """Reject an update whose tensor names differ from the spec (values are not read)."""
        got = set(iter(update))
        expected = set(self._slots)
        if got != expected:
            missing = sorted(expected - got)
            unexpected = sorted(got - expected)
            raise UpdateRejected(
                f"update tensor names differ from the model: missing {missing}, "
                f"unexpected {unexpected}"
            )


def _check_weight(weight: float) -> float:
    """Return ``weight`` as a float, or reject it unless it is finite and positive."""
    if isinstance(weight, bool) or not isinstance(weight, int | float | np.number):
        raise UpdateRejected(f"weight must be a positive number, got {weight!r}")
    factor = float(weight)
    if not (math.isfinite(factor) and factor > 0.0):
        raise UpdateRejected(f"weight must be finite and > 0, got {weight!r}")
    return factor


def _check_tensor(name: str, slot: _Slot, value: npt.NDArray[Any], factor: float) -> None:
    """Reject one tensor of an update unless it is numeric, shaped exactly, and finite."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiu":
        raise UpdateRejected(
            f"tensor {name!r}: expected a float or integer dtype, got {array.dtype}"
        )
    if array.shape != slot.shape:
        raise UpdateRejected(f"tensor {name!r}: expected shape {slot.shape}, got {array.shape}")
    if array.dtype.kind != "f" or array.size == 0:
        return
    values = flat(array)
    peak = max(float(np.max(np.abs(values[part]))) for part in blocks(values.size))
    if not math.isfinite(peak):
        raise UpdateRejected(f"tensor {name!r}: expected finite values, got NaN or inf")
    if not math.isfinite(peak * factor):
        raise UpdateRejected(
            f"tensor {name!r}: value {peak:g} times weight {factor:g} overflows float64"
        )
