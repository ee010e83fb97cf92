"""The round observer that keeps a run's Prometheus metrics current.

It runs on the coordinator's event loop, the scrape on the endpoint's thread:
prometheus_client's metrics take their own locks, so the hand-off needs nothing more.
What the observer reads from the registry (the online nodes) it reads on the loop, never
from the scrape thread, whose reads of the registry's dictionaries would race its writes.

A round of a thousand clients settles a thousand tasks, so :meth:`task_settled` only adds
to plain sums; they reach the counters (each a lock) at every phase change, when the round
ends, and at most :data:`FLUSH_S` after a settlement. The online nodes are recounted at
most once per :data:`FLUSH_S` however often the registry changes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from geofl.protocols.types import Metrics, WeightsView
from geofl.server.metrics.families import IDLE_PHASE, RunMetrics
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import Phase, RoundRecord, secagg_abort_stage

__all__ = ["FLUSH_S", "NO_REGION", "MetricsObserver"]

#: Region label of nodes that named none.
NO_REGION = "none"
#: Longest delay of settled tasks' figures and of the online-node count, seconds of the
#: coordinator's clock.
FLUSH_S = 0.5

Stage = Callable[[TaskRecord, Outcome], Awaitable[None]]


class _Transfers:
    """The four byte counters of one region, resolved once, and what waits to be added."""

    def __init__(self, metrics: RunMetrics, region: str) -> None:
        self.counters = (
            metrics.bytes.labels("up", region),
            metrics.bytes.labels("down", region),
            metrics.raw_bytes.labels("up", region),
            metrics.raw_bytes.labels("down", region),
        )
        #: Bytes up, down, up raw, down raw settled since the last flush.
        self.pending = [0, 0, 0, 0]

    def flush(self) -> None:
        for counter, amount in zip(self.counters, self.pending, strict=True):
            if amount:
                counter.inc(amount)
        self.pending = [0, 0, 0, 0]


class MetricsObserver(RoundObserver):
    """Rounds, phases, participations, bytes and nodes of one run, as Prometheus metrics.

    Parameters
    ----------
    metrics
        The run's metric families (on the run's own registry).
    registry
        The run's nodes: their regions label the bytes, their count is a gauge.
    clock
        The coordinator's clock: round durations are its seconds (simulated ones on the
        virtual clock).
    """

    def __init__(self, metrics: RunMetrics, registry: Registry, clock: Clock = WALL_CLOCK) -> None:
        self.metrics = metrics
        self._registry = registry
        self._clock = clock
        self._regions: dict[int, str] = {}
        self._transfers: dict[str, _Transfers] = {}
        self._participations: dict[tuple[str, str], Counter] = {}
        self._pending_participations: dict[tuple[str, str], int] = {}
        self._flush: asyncio.TimerHandle | None = None
        self._connected_seen: set[str] = set()
        self._round_started: dict[int, float] = {}
        self._staged_by_round: dict[int, int] = {}
        self._recount: asyncio.TimerHandle | None = None
        self._unsubscribe = registry.changes.subscribe(self._nodes_changed)
        metrics.phase.state(IDLE_PHASE)
        self.recount_nodes()

    # ------------------------------------------------------------ nodes

    def _nodes_changed(self) -> None:
        if self._recount is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # changed outside a loop (set-up): count now
            self.recount_nodes()
            return
        self._recount = loop.call_later(FLUSH_S, self.recount_nodes)

    def recount_nodes(self) -> None:
        """Set the connected-nodes gauge from the registry, and learn the nodes' regions."""
        self._recount = None
        counts: dict[str, int] = {}
        for session in self._registry.online():
            region = session.region or NO_REGION
            self._regions[session.node_id] = region
            counts[region] = counts.get(region, 0) + 1
        for region in self._connected_seen - counts.keys():
            self.metrics.connected.labels(region).set(0)
        for region, count in counts.items():
            self.metrics.connected.labels(region).set(count)
        self._connected_seen |= counts.keys()

    def _region_of(self, node_id: int) -> str:
        region = self._regions.get(node_id)
        if region is None:  # joined since the last recount
            self.recount_nodes()
            region = self._regions.setdefault(node_id, NO_REGION)
        return region

    # ------------------------------------------------------------ rounds

    def round_started(self, number: int, cohort_target: int) -> None:
        self._round_started[number] = self._clock.monotonic()
        self.metrics.round_current.set(number)
        self.metrics.cohort_target.set(cohort_target)

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        self.flush()
        self.metrics.phase.state(phase.value)

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        key = (task.kind, outcome.status)
        pending = self._pending_participations
        pending[key] = pending.get(key, 0) + 1
        region = self._region_of(task.node_id)
        transfers = self._transfers.get(region)
        if transfers is None:
            transfers = self._transfers[region] = _Transfers(self.metrics, region)
        sums = transfers.pending
        sums[0] += outcome.bytes_up
        sums[1] += task.bytes_down
        sums[2] += outcome.bytes_up_raw
        sums[3] += task.bytes_down_raw
        if self._flush is None:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # settled outside a loop: add now
            self.flush()
            return
        self._flush = loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Add the settled tasks' participations and bytes to the counters."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        for key, count in self._pending_participations.items():
            counter = self._participations.get(key)
            if counter is None:
                counter = self._participations[key] = self.metrics.participations.labels(*key)
            counter.inc(count)
        self._pending_participations = {}
        for transfers in self._transfers.values():
            transfers.flush()

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        self.metrics.round_last_committed.set(record.number)
        losses = self.metrics.losses
        for source, loss, values in (
            ("train", record.train_loss, record.fit_metrics),
            ("eval", record.eval_loss, record.eval_metrics),
            ("server_eval", record.server_eval_loss, record.server_eval_metrics),
        ):
            if loss is not None:
                losses.labels(source).set(loss)
            self._set_round_metrics(source, values)

    def _set_round_metrics(self, source: str, values: Metrics) -> None:
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.metrics.round_metrics.labels(source, name).set(value)

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        stage = secagg_abort_stage(reason)
        if stage is not None:
            self.metrics.secagg_aborts.labels(stage).inc()

    def round_ended(self, record: RoundRecord, status: str) -> None:
        self.flush()
        ended = "committed" if status == "committed" else "failed"
        self.metrics.rounds.labels(ended).inc()
        started = self._round_started.pop(record.number, None)
        if started is not None:
            seconds = self._clock.monotonic() - started
            self.metrics.round_seconds.labels(ended).observe(seconds)
        for phase, seconds in record.phase_durations.items():
            self.metrics.phase_seconds.labels(phase).observe(seconds)
        self.metrics.phase.state(IDLE_PHASE)
        self._staged_by_round.pop(record.number, None)
        self.metrics.staged_pending.set(sum(self._staged_by_round.values()))

    # ------------------------------------------------------------ staging

    def timed_staging(self, stage: Stage) -> Stage:
        """``stage`` (durable upload staging), counted and timed."""
        metrics = self.metrics

        async def timed(task: TaskRecord, outcome: Outcome) -> None:
            began = self._clock.monotonic()
            try:
                await stage(task, outcome)
            except BaseException:
                metrics.staging_failures.inc()
                raise
            metrics.staging_seconds.observe(self._clock.monotonic() - began)
            metrics.staged.inc()
            self._staged_by_round[task.round] = self._staged_by_round.get(task.round, 0) + 1
            metrics.staged_pending.set(sum(self._staged_by_round.values()))

        return timed

    def resumed_updates(self, number: int, count: int) -> None:
        """``count`` staged updates of round ``number`` survived a restart and wait."""
        if count:
            self._staged_by_round[number] = self._staged_by_round.get(number, 0) + count
            self.metrics.staged_pending.set(sum(self._staged_by_round.values()))

    # ------------------------------------------------------------ life

    def close(self) -> None:
        """Stop following the registry (the run is over)."""
        self._unsubscribe()
        self.flush()
        if self._recount is not None:
            self._recount.cancel()
            self._recount = None
        with contextlib.suppress(RuntimeError):
            self.recount_nodes()
