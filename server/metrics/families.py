"""Every metric a coordinator exports, defined once on a registry of its own.

A :class:`RunMetrics` registers its families on the :class:`CollectorRegistry` it is given,
never on prometheus_client's global one: two coordinators in one process (tests, a
benchmark) keep their figures apart, and stopping a run leaves nothing behind. Durations
are the coordinator's clock: simulated seconds on the virtual clock. docs/metrics.md
lists the same families (a test compares the two).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from geofl.server.models.spool import MemoryBudget
from geofl.server.rounds.records import Phase

__all__ = ["IDLE_PHASE", "PHASE_SECONDS", "ROUND_SECONDS", "RunMetrics", "UploadBufferCollector"]

#: Buckets of a whole round: sub-second loopback rounds to WAN rounds of hours.
ROUND_SECONDS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200)
#: Buckets of one phase: selection and aggregation are often milliseconds.
PHASE_SECONDS = (0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
#: The round-phase state between rounds (before the first, after the last).
IDLE_PHASE = "idle"


class RunMetrics:
    """The metric families of one run, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.run = Info("geofl_run", "The run these metrics describe.", registry=registry)
        self.rounds = Counter(
            "geofl_rounds",
            "Rounds that ended, by status (committed, failed).",
            ["status"],
            registry=registry,
        )
        self.round_current = Gauge(
            "geofl_round_current",
            "Number of the round in progress (or last ended).",
            registry=registry,
        )
        self.round_last_committed = Gauge(
            "geofl_round_last_committed",
            "Number of the last committed round (0: none yet).",
            registry=registry,
        )
        self.cohort_target = Gauge(
            "geofl_round_cohort_target", "Clients the current round aims at.", registry=registry
        )
        self.phase = Enum(
            "geofl_round_phase",
            "Phase of the current round.",
            states=[IDLE_PHASE, *(p.value for p in Phase)],
            registry=registry,
        )
        self.round_seconds = Histogram(
            "geofl_round_duration_seconds",
            "Duration of each round, by status.",
            ["status"],
            buckets=ROUND_SECONDS,
            registry=registry,
        )
        self.phase_seconds = Histogram(
            "geofl_phase_duration_seconds",
            "Time each ended round spent in each phase (observed when the round ends).",
            ["phase"],
            buckets=PHASE_SECONDS,
            registry=registry,
        )
        self.participations = Counter(
            "geofl_participations",
            "Settled tasks, by kind (fit, evaluate, secure-aggregation stages) and status.",
            ["kind", "status"],
            registry=registry,
        )
        self.bytes = Counter(
            "geofl_transfer_bytes",
            "Bytes on the wire of settled tasks, by direction (up, down) and node region.",
            ["direction", "region"],
            registry=registry,
        )
        self.raw_bytes = Counter(
            "geofl_transfer_raw_bytes",
            "The same transfers before compression, by direction and node region.",
            ["direction", "region"],
            registry=registry,
        )
        self.connected = Gauge(
            "geofl_connected_nodes", "Online nodes, by region.", ["region"], registry=registry
        )
        self.secagg_aborts = Counter(
            "geofl_secagg_aborts",
            "Rounds whose secure aggregation aborted, by the stage it aborted in.",
            ["stage"],
            registry=registry,
        )
        self.staged = Counter(
            "geofl_staged_updates",
            "Accepted fit updates made durable (disk and database) before their ack.",
            registry=registry,
        )
        self.staging_failures = Counter(
            "geofl_staging_failures",
            "Accepted fit updates whose staging failed (the upload was refused).",
            registry=registry,
        )
        self.staging_seconds = Histogram(
            "geofl_staging_duration_seconds",
            "Time to stage one update durably (file fsync and database row).",
            buckets=PHASE_SECONDS,
            registry=registry,
        )
        self.staged_pending = Gauge(
            "geofl_staged_updates_pending",
            "Staged updates of rounds not yet ended (what a restart would fold again).",
            registry=registry,
        )
        self.losses = Gauge(
            "geofl_round_loss",
            "Loss of the last committed round, by source (train, eval, server_eval).",
            ["source"],
            registry=registry,
        )
        self.round_metrics = Gauge(
            "geofl_round_metric",
            "Numeric metrics of the last committed round, by source and name.",
            ["source", "name"],
            registry=registry,
        )


class UploadBufferCollector(Collector):
    """The memory budget of uploads being received, read at scrape time (it has a lock)."""

    def __init__(self, budget: MemoryBudget) -> None:
        self._budget = budget

    def collect(self) -> Iterator[Metric]:
        budget = self._budget
        for name, value, text in (
            ("used", budget.used, "Bytes of uploads held in memory now."),
            ("peak", budget.peak, "Most bytes of uploads held in memory at once."),
            ("limit", budget.limit, "server.upload_buffer_bytes; beyond it uploads spill."),
        ):
            yield GaugeMetricFamily(f"geofl_upload_buffer_{name}_bytes", text, value=value)
