"""What every engine is made of, handed over in one piece by the factory's callers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from geofl.protocols.types import Weights
from geofl.server.config.compression import CompressionConfig
from geofl.server.models.staging import ResumedUpdate
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.evaluation import ServerEvaluate
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.secure import SecureSettings
from geofl.server.rounds.tasks import TaskRunner
from geofl.server.scheduling.scheduler import Scheduler
from geofl.server.strategies import Strategy


@dataclass(frozen=True)
class EngineParts:
    """The state an engine works on and the parts it is composed with.

    Attributes
    ----------
    registry
        The connected nodes; the engine hands them tasks.
    strategy
        Folds updates and takes the server step.
    models
        Where each model version is published for download.
    observer
        Hears of everything (usually :class:`~geofl.server.rounds.observers.Observers`).
    start_round
        The first round to run (after a resume, the one after the last committed).
    weights
        The model the first round starts from.
    clock
        Wall clock, or the simulation's virtual one.
    server_evaluate
        The configured server-side evaluation, if any.
    compression
        Upload compression per region (None: uncompressed).
    secure
        Secure aggregation's settings (None: plain rounds).
    scheduler
        Measurements, deadline-aware selection and adaptive codecs (None: uniform).
    resumed
        Updates of ``start_round`` accepted before a restart (see
        :mod:`geofl.server.models.staging`): folded again, their nodes not asked to train.
    stop_requested
        Checked before each round (version): True ends the run there (``geofl runs stop``).
    """

    registry: Registry
    strategy: Strategy
    models: ModelStore
    observer: RoundObserver
    start_round: int
    weights: Weights
    clock: Clock = WALL_CLOCK
    server_evaluate: ServerEvaluate | None = None
    compression: CompressionConfig | None = None
    secure: SecureSettings | None = None
    scheduler: Scheduler | None = None
    resumed: Sequence[ResumedUpdate] = ()
    stop_requested: Callable[[], bool] = lambda: False

    def task_runner(
        self, deadline_s: float, on_release: Callable[[TaskRecord], None] = lambda task: None
    ) -> TaskRunner:
        """The engine's task runner over these parts (``deadline_s``: a task's default)."""
        return TaskRunner(
            self.registry,
            self.observer,
            clock=self.clock,
            deadline_s=deadline_s,
            compression=self.compression,
            scheduler=self.scheduler,
            on_release=on_release,
        )


class Engine(Protocol):
    """Runs a run's remaining rounds over the registry; every engine is one."""

    @property
    def weights(self) -> Weights:
        """The model after the last committed round."""

    async def run(self) -> None:
        """Every remaining round; raises ``NoClientsError`` if clients never come."""


__all__ = ["Engine", "EngineParts"]
