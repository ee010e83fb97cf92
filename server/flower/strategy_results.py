"""What a Flower strategy computes on the server, handed to geofl's records as it happens.

``Strategy.start`` (``flwr.serverapp.strategy``) keeps two kinds of result no message
carries: the metrics ``aggregate_train``/``aggregate_evaluate`` return (a custom
aggregation may return anything) and the results of the ``evaluate_fn`` the ServerApp
passes for central evaluation.  Flower only logs them and returns them in its ``Result``
at the end.  geofl has no other way to see them than to be in the call, so
:func:`install` replaces ``Strategy.start`` with :func:`_recording_start`: when the
strategy runs on a :class:`~geofl.server.flower.grid.GeoflGrid`, the start wraps
``evaluate_fn`` and, for the length of the call, the strategy's two aggregation methods,
and reports each result to the grid (:meth:`GeoflGrid.record_computed`); on any other grid
it is Flower's own ``start``, unchanged.  The results are returned to Flower untouched.

Legacy apps (``ServerApp(server_fn=...)``, Flower's ``Server`` or ``DefaultWorkflow``) keep
the same results in a ``flwr.server.History``: the ``History.add_*`` methods are wrapped
too, and report to the grid of the ServerApp running in the calling thread
(:func:`reporting_to`, which the coordinator enters around the ServerApp).

A strategy class that overrides ``start`` itself is not seen; its rounds are still
recorded from its messages (:mod:`.recording`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.server import History
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from geofl.server.flower.grid import GeoflGrid
from geofl.server.flower.recording import ServerSource

__all__ = ["install", "reporting_to"]

_FLOWER_START = Strategy.start
_install_lock = threading.Lock()
_running = threading.local()
#: History's methods for the legacy workflow's results, and what each result is.
_HISTORY_LOSSES: dict[str, ServerSource] = {
    "add_loss_centralized": "server",
    "add_loss_distributed": "evaluate",
}
_HISTORY_METRICS: dict[str, ServerSource] = {
    "add_metrics_centralized": "server",
    "add_metrics_distributed_fit": "fit",
    "add_metrics_distributed": "evaluate",
}

EvaluateFn = Callable[[int, ArrayRecord], MetricRecord | None]


def install() -> None:
    """Make ``Strategy.start`` and ``History`` report to geofl's grid (idempotent)."""
    with _install_lock:
        if Strategy.start is _recording_start:
            return
        Strategy.start = _recording_start  # type: ignore[method-assign]
        for name, source in _HISTORY_LOSSES.items():
            setattr(History, name, _loss_hook(getattr(History, name), source))
        for name, source in _HISTORY_METRICS.items():
            setattr(History, name, _metrics_hook(getattr(History, name), source))


@contextlib.contextmanager
def reporting_to(grid: GeoflGrid) -> Iterator[None]:
    """The legacy results this thread adds to a ``History`` go to ``grid``."""
    _running.grid = grid
    try:
        yield
    finally:
        _running.grid = None


def _current_grid() -> GeoflGrid | None:
    grid: GeoflGrid | None = getattr(_running, "grid", None)
    return grid


def _loss_hook(add: Callable[..., None], source: ServerSource) -> Callable[..., None]:
    def add_loss(self: History, server_round: int, loss: float) -> None:
        add(self, server_round=server_round, loss=loss)
        grid = _current_grid()
        if grid is not None:
            grid.record_computed(server_round, source, {}, loss=float(loss))

    return add_loss


def _metrics_hook(add: Callable[..., None], source: ServerSource) -> Callable[..., None]:
    def add_metrics(self: History, server_round: int, metrics: Mapping[str, Any]) -> None:
        add(self, server_round=server_round, metrics=metrics)
        grid = _current_grid()
        if grid is not None:
            grid.record_computed(server_round, source, metrics)

    return add_metrics


def _recording_start(
    self: Strategy,
    grid: Grid,
    initial_arrays: ArrayRecord,
    num_rounds: int = 3,
    timeout: float = 3600,
    train_config: ConfigRecord | None = None,
    evaluate_config: ConfigRecord | None = None,
    evaluate_fn: EvaluateFn | None = None,
) -> Result:
    """Flower's ``Strategy.start``, reporting its server-side results to a GeoflGrid."""
    if not isinstance(grid, GeoflGrid):
        return _FLOWER_START(
            self,
            grid,
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            evaluate_fn,
        )
    watched = _Watched(self, grid)
    with watched:
        return _FLOWER_START(
            self,
            grid,
            initial_arrays,
            num_rounds,
            timeout,
            train_config,
            evaluate_config,
            None if evaluate_fn is None else watched.evaluate_fn(evaluate_fn),
        )


class _Watched:
    """For the length of one ``start``: the strategy's aggregations report their metrics.

    The wrappers are set on the instance and removed afterwards (an attribute the
    instance had of its own is put back), so the class and other instances are untouched.
    """

    _METHODS = ("aggregate_train", "aggregate_evaluate")

    def __init__(self, strategy: Strategy, grid: GeoflGrid) -> None:
        self._strategy = strategy
        self._grid = grid
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> None:
        own = getattr(self._strategy, "__dict__", None)
        if own is None:  # a strategy with __slots__ only: its aggregates are not seen
            return
        self._saved = {name: own[name] for name in self._METHODS if name in own}
        train, evaluate = self._strategy.aggregate_train, self._strategy.aggregate_evaluate

        def aggregate_train(
            server_round: int, replies: Iterable[Message]
        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
            arrays, metrics = train(server_round, replies)
            if metrics is not None:
                self._grid.record_computed(server_round, "fit", metrics)
            return arrays, metrics

        def aggregate_evaluate(
            server_round: int, replies: Iterable[Message]
        ) -> MetricRecord | None:
            metrics = evaluate(server_round, replies)
            if metrics is not None:
                self._grid.record_computed(server_round, "evaluate", metrics)
            return metrics

        own["aggregate_train"] = aggregate_train
        own["aggregate_evaluate"] = aggregate_evaluate

    def __exit__(self, *exc: object) -> None:
        own = getattr(self._strategy, "__dict__", None)
        if own is None:
            return
        for name in self._METHODS:
            own.pop(name, None)
        own.update(self._saved)

    def evaluate_fn(self, evaluate_fn: EvaluateFn) -> EvaluateFn:
        """``evaluate_fn``, reporting each result it returns."""

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            metrics = evaluate_fn(server_round, arrays)
            if metrics is not None:
                self._grid.record_computed(server_round, "server", metrics)
            return metrics

        return evaluate
