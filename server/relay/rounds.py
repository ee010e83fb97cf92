"""The pure parts of a relay's regional rounds: version numbers, time budget, results.

Model versions. A client skips the download of a version it already holds, so a version
number must never name two different models. The coordinator's version ``g`` is published
at the relay as ``g * (local_rounds + 1)`` and its regional rounds produce the versions
after it, up to ``g * (local_rounds + 1) + local_rounds``; the next global version starts
after that. Equal coordinator versions are equal models, so the numbering also holds
across a relay restart, and an evaluation of version ``g`` shares its number (and its
download) with the fit that starts from ``g``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Metrics, Scalar, Weights, WeightsView
from geofl.server.config import ScheduleConfig
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord

__all__ = [
    "MIN_UPLOAD_RESERVE_S",
    "UPLOAD_RESERVE",
    "MemoryRecorder",
    "RegionalError",
    "RegionalEvaluation",
    "RegionalResult",
    "UpstreamTask",
    "VersionPlan",
    "local_budget",
    "regional_round_config",
]

#: Share of the time left before the coordinator's deadline kept for the relay's upload.
UPLOAD_RESERVE = 0.1
#: ... and at least this many seconds.
MIN_UPLOAD_RESERVE_S = 1.0


class RegionalError(GeoflError):
    """The region cannot produce a result for the coordinator's task (reported upstream)."""


@dataclass(frozen=True)
class UpstreamTask:
    """What the relay knows of the coordinator's task in hand."""

    run_id: int
    model_version: int
    #: Unix seconds; None when the coordinator set no deadline.
    deadline_unix_s: float | None


@dataclass(frozen=True)
class RegionalResult:
    """The region's answer to a fit task: weights, the contributors' examples, metrics."""

    weights: Weights
    num_examples: int
    metrics: Metrics


@dataclass(frozen=True)
class RegionalEvaluation:
    """The region's answer to an evaluation task."""

    loss: float
    num_examples: int
    metrics: Metrics


class VersionPlan:
    """Local model versions: see the module docstring.

    A global model published for an evaluation keeps its number for the fit that starts
    from it next; once regional rounds have started from it, it is never reused.
    """

    def __init__(self, local_rounds: int) -> None:
        self._rounds = local_rounds
        self._last = -1  # the highest local version handed out
        self._pending: tuple[int, int] | None = None  # (global, local) not yet trained from

    def base(self, global_version: int) -> int:
        """The local version under which the global model ``global_version`` is published."""
        if self._pending is not None and self._pending[0] == global_version:
            return self._pending[1]
        local = max(global_version * (self._rounds + 1), self._last + 1)
        self._pending, self._last = (global_version, local), local
        return local

    def rounds(self, global_version: int) -> tuple[int, int]:
        """First and last local round numbers of a fit starting from ``global_version``."""
        base = self.base(global_version)
        self._pending, self._last = None, base + self._rounds
        return base + 1, base + self._rounds


def regional_round_config(config: Mapping[str, Scalar]) -> dict[str, Scalar]:
    """The coordinator's round config for regional rounds; its round goes on as ``global_round``.

    The regional engine sets ``server_round`` to the local round's number, which only
    increases (see :class:`VersionPlan`).
    """
    round_config = dict(config)
    if "server_round" in round_config:
        round_config["global_round"] = round_config["server_round"]
    return round_config


def local_budget(
    remaining_s: float | None, schedule: ScheduleConfig, rounds: int
) -> tuple[float, float]:
    """(deadline of each regional round, wait for clients) within the coordinator's deadline.

    A share of the time left (:data:`UPLOAD_RESERVE`, at least
    :data:`MIN_UPLOAD_RESERVE_S`) is kept for uploading the region's result; the rest is
    split evenly over the regional rounds.

    Raises
    ------
    RegionalError
        If no time is left for a regional round.
    """
    if remaining_s is None:
        return schedule.deadline_s, schedule.wait_for_clients_s
    usable = remaining_s - max(MIN_UPLOAD_RESERVE_S, UPLOAD_RESERVE * remaining_s)
    if usable <= 0:
        raise RegionalError(
            f"the coordinator's deadline is {remaining_s:.1f} s away: no time for regional rounds"
        )
    return min(schedule.deadline_s, usable / rounds), min(schedule.wait_for_clients_s, usable)


@dataclass
class MemoryRecorder(RoundObserver):
    """Keeps what a task's regional rounds produced; a relay has no database."""

    committed: list[RoundRecord] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    weights: WeightsView | None = None

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        """Keep the round's record and its model (the next round starts from it)."""
        self.committed.append(record)
        self.weights = weights

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        """Keep the reason, to report it if no round commits."""
        self.failures.append(f"local round {record.number}: {reason}")

    def result(self) -> RegionalResult:
        """The last committed model, the examples of every client that contributed.

        Metrics are those of the last committed round (weighted means over its clients),
        plus ``relay_clients`` (distinct contributing clients) and ``relay_rounds``.
        """
        if self.weights is None or not self.committed:
            reasons = "; ".join(self.failures) or "no regional round ran"
            raise RegionalError(f"no regional round committed: {reasons}")
        examples: dict[int, int] = {}
        for record in self.committed:
            for task, outcome in record.outcomes:
                if task.kind == "fit" and outcome.status == "ok":
                    examples[task.node_id] = outcome.num_examples
        last = self.committed[-1]
        metrics: Metrics = dict(last.fit_metrics)
        if last.train_loss is not None:
            metrics.setdefault("train_loss", last.train_loss)
        metrics["relay_clients"] = len(examples)
        metrics["relay_rounds"] = len(self.committed)
        return RegionalResult(dict(self.weights), sum(examples.values()), metrics)
