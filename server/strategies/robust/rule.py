"""The interface every robust rule implements, and the checks they share."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.strategies._numeric import F64Array, blocks, flat
from geofl.server.strategies.errors import StrategyError
from geofl.server.strategies.streaming import StreamingMean, TensorSpecLike

__all__ = ["RobustRule", "float_norm", "state_vector"]


class RobustRule(ABC):
    """How one round's updates become its aggregate delta, robustly.

    A rule builds the round's accumulator (:meth:`accumulator`); the accumulator's ``add``
    returns an :class:`~geofl.server.strategies.checks.UpdateCheck` per update and its
    ``mean`` the robust aggregate. After the server step succeeded, :meth:`commit` lets a
    rule with memory (adaptive clip norm, centered clipping's centre) take the round in.
    """

    name: ClassVar[str]

    @abstractmethod
    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> StreamingMean:
        """An empty accumulator for this round's deltas against a model shaped ``spec``."""

    @abstractmethod
    def min_updates(self) -> int:
        """The fewest updates the rule can aggregate within its breakdown point."""

    @abstractmethod
    def hyperparameters(self) -> Config:
        """The rule's settings by name (for ``repr`` and the run record)."""

    def commit(self, mean_delta: WeightsView) -> None:  # noqa: B027 - most rules keep nothing
        """The round's aggregate was applied: update what the rule remembers (default none)."""

    def state(self) -> Weights:
        """The rule's memory as named float64 arrays (``{}`` for a memoryless rule)."""
        return {}

    def load_state(self, state: WeightsView) -> None:
        """Restore :meth:`state` after a restart (``{}`` resets it)."""
        if state:
            raise StrategyError(f"robust rule {self.name!r} keeps no state, got {sorted(state)}")

    def __repr__(self) -> str:
        params = ", ".join(f"{key}={value!r}" for key, value in self.hyperparameters().items())
        return f"{type(self).__name__}({params})"


def float_norm(update: WeightsView, names: tuple[str, ...]) -> float:
    """The L2 norm of the float tensors ``names`` of ``update`` (integer counters left out)."""
    total = 0.0
    for name in names:
        values = flat(np.asarray(update[name]))
        for part in blocks(values.size):
            piece = values[part].astype(np.float64)
            total += float(np.dot(piece, piece))
    return math.sqrt(total)


def state_vector(state: WeightsView, key: str) -> F64Array | None:
    """A saved float64 state vector, or None when ``state`` lacks ``key``.

    Raises
    ------
    StrategyError
        If the array is not a finite float vector, or ``state`` has other keys.
    """
    unexpected = sorted(set(state) - {key})
    if unexpected:
        raise StrategyError(f"unexpected robust state keys {unexpected}; expected {key!r}")
    if key not in state:
        return None
    array: Any = np.asarray(state[key])
    if array.dtype.kind != "f" or not bool(np.isfinite(array).all()):
        raise StrategyError(f"robust state {key!r} must hold finite floats")
    return np.array(array, dtype=np.float64, copy=True).reshape(-1)
