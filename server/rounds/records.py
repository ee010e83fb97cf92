"""What a round is: its phases and their clock, its record, its settings, how it fails."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Metrics, Scalar
from geofl.server.nodes.clock import Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundObserver

if TYPE_CHECKING:
    from geofl.server.config import RunConfig, ScheduleConfig


class Phase(enum.Enum):
    """States of one round (ADVERTISE, SHARE and UNMASK only under secure aggregation)."""

    SELECT = "select"
    ADVERTISE = "advertise"
    SHARE = "share"
    BROADCAST = "broadcast"
    FIT = "fit"
    UNMASK = "unmask"
    AGGREGATE = "aggregate"
    EVALUATE = "evaluate"
    COMMIT = "commit"
    FAILED = "failed"


_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.SELECT: frozenset({Phase.BROADCAST, Phase.ADVERTISE, Phase.SHARE, Phase.FAILED}),
    Phase.ADVERTISE: frozenset({Phase.SHARE, Phase.FAILED}),
    Phase.SHARE: frozenset({Phase.BROADCAST, Phase.FAILED}),
    Phase.BROADCAST: frozenset({Phase.FIT, Phase.FAILED}),
    Phase.FIT: frozenset({Phase.AGGREGATE, Phase.UNMASK, Phase.FAILED}),
    Phase.UNMASK: frozenset({Phase.AGGREGATE, Phase.FAILED}),
    Phase.AGGREGATE: frozenset({Phase.EVALUATE, Phase.FAILED}),
    Phase.EVALUATE: frozenset({Phase.COMMIT, Phase.FAILED}),
    Phase.COMMIT: frozenset(),
    Phase.FAILED: frozenset(),
}


class RoundFailedError(GeoflError):
    """The round cannot complete; the reason is recorded and the run goes on."""


#: How a round failed by a secure-aggregation abort begins its reason (metrics count them).
SECAGG_ABORT_PREFIX = "secure aggregation aborted in stage "


def secagg_abort_reason(stage: str, detail: str) -> str:
    """The failure reason of a round whose secure aggregation aborted in ``stage``."""
    return f"{SECAGG_ABORT_PREFIX}{stage}: {detail}"


def secagg_abort_stage(reason: str) -> str | None:
    """The stage a round's failure ``reason`` says secure aggregation aborted in, if any."""
    if not reason.startswith(SECAGG_ABORT_PREFIX):
        return None
    return reason[len(SECAGG_ABORT_PREFIX) :].partition(":")[0]


class NoClientsError(GeoflError):
    """Not enough clients connected within ``wait_for_clients_s``: the run fails."""


def round_config(config: RunConfig) -> dict[str, Scalar]:
    """What every fit task is configured with; mode diloco sets ``local_steps`` to H."""
    values: dict[str, Scalar] = dict(config.round_config)
    if config.schedule.mode == "diloco":
        values.setdefault("local_steps", config.schedule.diloco.local_steps)
    return values


@dataclass(frozen=True)
class EngineSettings:
    """The parts of the run configuration an engine uses."""

    rounds: int
    clients_per_round: int
    min_clients: int
    over_select: float
    deadline_s: float
    wait_for_clients_s: float
    round_config: dict[str, Scalar]
    evaluate_every: int
    evaluate_clients: int
    evaluate_config: dict[str, Scalar]
    seed: int
    #: The most examples a client's update is weighted by (None: as reported).
    max_examples_per_client: int | None = None

    @classmethod
    def from_config(cls, config: RunConfig) -> EngineSettings:
        """The coordinator's engine: the run's rounds, cohort, deadlines and evaluation."""
        evaluation = config.evaluation
        return cls(
            rounds=config.run.rounds,
            clients_per_round=config.strategy.clients_per_round,
            min_clients=config.strategy.min_clients,
            over_select=config.schedule.over_select,
            deadline_s=config.schedule.deadline_s,
            wait_for_clients_s=config.schedule.wait_for_clients_s,
            round_config=round_config(config),
            evaluate_every=evaluation.every,
            evaluate_clients=config.evaluation_clients,
            evaluate_config=dict(evaluation.config),
            seed=config.run.seed,
            max_examples_per_client=config.strategy.max_examples_per_client,
        )

    @classmethod
    def regional(
        cls,
        schedule: ScheduleConfig,
        *,
        rounds: int,
        cohort: int,
        min_clients: int,
        budget: tuple[float, float],
        config: dict[str, Scalar],
        evaluate: bool,
        seed: int,
    ) -> EngineSettings:
        """A relay's engine for one task of its coordinator (relay processes and simulated).

        ``budget`` is (each regional round's deadline, the wait for clients) within the
        coordinator's deadline; the regional cohort also evaluates, when asked to.
        """
        deadline_s, wait_s = budget
        return cls(
            rounds=rounds,
            clients_per_round=cohort,
            min_clients=min_clients,
            over_select=schedule.over_select,
            deadline_s=deadline_s,
            wait_for_clients_s=wait_s,
            round_config=config,
            evaluate_every=1 if evaluate else 0,
            evaluate_clients=cohort,
            evaluate_config=config,
            seed=seed,
        )


@dataclass
class RoundRecord:
    """What a round produced, handed to the observers at commit."""

    number: int
    phase_durations: dict[str, float] = field(default_factory=dict)
    outcomes: list[tuple[TaskRecord, Outcome]] = field(default_factory=list)
    train_loss: float | None = None
    fit_metrics: Metrics = field(default_factory=dict)
    eval_loss: float | None = None
    eval_metrics: Metrics = field(default_factory=dict)
    server_eval_loss: float | None = None
    server_eval_metrics: Metrics = field(default_factory=dict)


class PhaseClock:
    """Times each phase of a round; with ``ordered``, enforces the legal transitions.

    A buffered asynchronous version's phases need not follow the synchronous order.
    """

    def __init__(
        self, record: RoundRecord, observer: RoundObserver, clock: Clock, *, ordered: bool = True
    ) -> None:
        self._record = record
        self._observer = observer
        self._clock = clock
        self._ordered = ordered
        self._phase: Phase | None = None
        self._since = clock.monotonic()

    def enter(self, phase: Phase) -> None:
        """Close the current phase and open ``phase``."""
        if self._ordered and self._phase is not None and phase not in _NEXT[self._phase]:
            raise RuntimeError(f"illegal round transition {self._phase.value} -> {phase.value}")
        elapsed = self.stop()
        self._phase = phase
        self._observer.phase(self._record.number, phase, elapsed)

    def stop(self) -> float | None:
        """Close the current phase's timer; its seconds, if a phase was open."""
        now = self._clock.monotonic()
        elapsed = None
        if self._phase is not None:
            key = self._phase.value
            elapsed = now - self._since
            self._record.phase_durations[key] = self._record.phase_durations.get(key, 0.0) + elapsed
        self._since = now
        return elapsed


__all__ = [
    "SECAGG_ABORT_PREFIX",
    "EngineSettings",
    "NoClientsError",
    "Phase",
    "PhaseClock",
    "RoundFailedError",
    "RoundRecord",
    "round_config",
    "secagg_abort_reason",
    "secagg_abort_stage",
]
