"""The strategy interface: one round's lifecycle as seen from the server.

A round runs ``configure_fit`` -> ``begin_round`` -> ``StreamingMean.add`` per arriving
update -> ``StreamingMean.mean`` -> ``apply``, then ``configure_evaluate`` and
``aggregate_metrics``. Strategies never mutate their arguments: configs and weights come
back as new objects. Optimizer state is exposed as named tensors (``state`` /
``load_state``) so the coordinator can checkpoint it beside the model and resume after a
crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar, TypeGuard

from geofl.protocols.types import Config, Metrics, Scalar, Weights, WeightsView
from geofl.server.strategies.errors import StrategyError
from geofl.server.strategies.streaming import StreamingMean

__all__ = ["Strategy", "weighted_metrics"]


class Strategy(ABC):
    """Abstract server strategy for rounds whose updates are deltas against the global model.

    Attributes
    ----------
    name
        Registry name, as written in the run's YAML (``strategy: {name: fedavg}``).
    """

    name: ClassVar[str]

    def configure_fit(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Return the config sent to this round's training clients (a new dict)."""
        return dict(base_config)

    def configure_evaluate(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Return the config sent to this round's evaluating clients (a new dict)."""
        return dict(base_config)

    @abstractmethod
    def begin_round(self, global_weights: WeightsView) -> StreamingMean:
        """Return an empty accumulator for this round's deltas against ``global_weights``."""

    @abstractmethod
    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """Take the server step from the averaged client delta; return new global weights."""

    @abstractmethod
    def state(self) -> Weights:
        """Return copies of the optimizer state tensors; ``{}`` for stateless strategies."""

    @abstractmethod
    def load_state(self, state: WeightsView) -> None:
        """Restore optimizer state saved by :meth:`state` (e.g. after a server restart)."""

    def aggregate_metrics(self, results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> Metrics:
        """Average client metrics weighted by ``num_examples``; see :func:`weighted_metrics`."""
        return weighted_metrics(results)


def weighted_metrics(results: Sequence[tuple[int, Mapping[str, Scalar]]]) -> Metrics:
    """Weighted average, by ``num_examples``, of the numeric metrics every client reported.

    Only ``int`` and ``float`` values count (``bool`` is not a number here); a metric that is
    missing from, or non-numeric in, any result is dropped rather than averaged over a
    subset, which would bias it towards the clients that happened to report it.

    Parameters
    ----------
    results
        ``(num_examples, metrics)`` per client.

    Returns
    -------
    Metrics
        Metric name -> weighted mean as ``float``, in the first result's key order; ``{}``
        when there are no results or no examples at all.

    Raises
    ------
    StrategyError
        If a ``num_examples`` is negative or not an integer.
    """
    for num_examples, _ in results:
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 0:
            raise StrategyError(f"num_examples must be an integer >= 0, got {num_examples!r}")
    total = sum(num_examples for num_examples, _ in results)
    if total == 0:
        return {}
    first = results[0][1]
    averaged: Metrics = {}
    for key in first:
        values = [metrics.get(key) for _, metrics in results]
        numbers = [float(v) for v in values if _is_number(v)]
        if len(numbers) != len(values):
            continue
        weighted = 0.0
        for (num_examples, _), value in zip(results, numbers, strict=True):
            weighted += num_examples * value
        averaged[key] = weighted / total
    return averaged


def _is_number(value: object) -> TypeGuard[int | float]:
    """Return whether ``value`` is an int or float (and not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
