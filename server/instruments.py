"""What watches a run from outside its database: metrics, the dashboard, experiment trackers.

The coordinator builds one :class:`RunInstruments` from the configuration
(``server.metrics``, ``server.dashboard``, ``tracking``) and knows nothing more about
them: it subscribes :attr:`RunInstruments.observers` to the rounds, wraps the durable
staging of uploads with
:meth:`RunInstruments.staging`, calls :meth:`RunInstruments.start` once it serves and
:meth:`RunInstruments.close` with the run's status. The same happens whether the run is
``geofl server`` or ``geofl simulate`` on either clock, since all three run a
:class:`~geofl.server.coordinator.Coordinator`.

MLflow and TensorBoard are optional extras, imported only when their section is set;
a missing one is a configuration error that says what to install.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from geofl.server.config import ConfigError, RunConfig
from geofl.server.control.admins import AdminSessions
from geofl.server.dashboard import Dashboard, check_access
from geofl.server.dashboard.history import History, load_history
from geofl.server.metrics import MetricsEndpoint, MetricsObserver, RunMetrics
from geofl.server.metrics.families import UploadBufferCollector
from geofl.server.models.spool import MemoryBudget
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.tracking.figures import RoundFigures, RunIdentity
from geofl.storage import Database

if TYPE_CHECKING:
    from geofl.server.tracking.mlflow_tracker import MlflowTracker
    from geofl.server.tracking.tensorboard_tracker import TensorBoardTracker

__all__ = ["RunInstruments"]

log = logging.getLogger(__name__)

Stage = Callable[[TaskRecord, Outcome], Awaitable[None]]


def _missing_extra(config: RunConfig, section: str, extra: str, exc: ImportError) -> ConfigError:
    return ConfigError.single(
        config.run.name,
        f"tracking.{section} needs the {exc.name or extra} package: pip install 'geofl[{extra}]'",
        path=f"tracking.{section}",
    )


class RunInstruments:
    """The metrics endpoint and trackers of one run (each only if configured).

    Parameters
    ----------
    config
        The run's configuration.
    registry
        The run's nodes (connected-node gauge, regions of the bytes).
    run_id
        The run's id in the database (a label, a tag, a directory name).
    upload_budget
        The memory budget of uploads being received (exported as gauges).
    clock
        The coordinator's clock.
    db
        The run's database: the dashboard's first render shows what it holds.
    sessions
        The admins' sessions guarding the dashboard (``None``: no login, loopback only).
    """

    def __init__(
        self,
        config: RunConfig,
        registry: Registry,
        run_id: int,
        upload_budget: MemoryBudget,
        clock: Clock = WALL_CLOCK,
        *,
        db: Database | None = None,
        sessions: AdminSessions | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._identity = RunIdentity(
            run_id, config.run.name, config.config_sha256(), config.to_dict()
        )
        self.observers: list[RoundObserver] = []
        self.metrics: MetricsObserver | None = None
        self.endpoint: MetricsEndpoint | None = None
        if config.server.metrics is not None:
            collectors = CollectorRegistry(auto_describe=True)
            collectors.register(UploadBufferCollector(upload_budget))
            families = RunMetrics(collectors)
            families.run.info(self._run_labels())
            self.metrics = MetricsObserver(families, registry, clock)
            self.endpoint = MetricsEndpoint(config.server.metrics, collectors)
            self.observers.append(self.metrics)
        self.dashboard = self._make_dashboard(registry, db, sessions)
        if self.dashboard is not None:
            self.observers.append(self.dashboard.live)
        self._mlflow = self._make_mlflow()
        self._tensorboard = self._make_tensorboard()
        trackers = [t for t in (self._mlflow, self._tensorboard) if t is not None]
        self._figures = RoundFigures(trackers, registry, clock) if trackers else None
        if self._figures is not None:
            self.observers.append(self._figures)
        self._started = False
        self._closed = False

    def _run_labels(self) -> dict[str, str]:
        config = self._config
        return {
            "run_name": config.run.name,
            "run_id": str(self._identity.run_id),
            "clock": "virtual" if self._clock.simulated else "wall",
            "mode": config.schedule.mode,
            "strategy": config.strategy.name,
        }

    def _make_dashboard(
        self, registry: Registry, db: Database | None, sessions: AdminSessions | None
    ) -> Dashboard | None:
        section = self._config.server.dashboard
        if section is None:
            return None
        check_access(section, sessions, self._config.run.name)
        run_id = self._identity.run_id
        history = (
            load_history(db, run_id)
            if db is not None
            else History(run={"id": run_id, "name": self._config.run.name, "status": "running"})
        )
        return Dashboard(section, history, registry, sessions, self._clock)

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's base URL (``http://host:port``) while it serves."""
        return self.dashboard.url if self.dashboard is not None else None

    def _make_mlflow(self) -> MlflowTracker | None:
        section = self._config.tracking.mlflow
        if section is None:
            return None
        try:
            from geofl.server.tracking.mlflow_tracker import MlflowTracker
        except ImportError as exc:
            raise _missing_extra(self._config, "mlflow", "mlflow", exc) from exc
        return MlflowTracker(section, self._identity)

    def _make_tensorboard(self) -> TensorBoardTracker | None:
        section = self._config.tracking.tensorboard
        if section is None:
            return None
        try:
            from geofl.server.tracking.tensorboard_tracker import TensorBoardTracker
        except ImportError as exc:
            raise _missing_extra(self._config, "tensorboard", "tensorboard", exc) from exc
        return TensorBoardTracker(section, self._identity)

    @property
    def metrics_port(self) -> int | None:
        """The bound port of the metrics endpoint, once started."""
        return self.endpoint.port if self.endpoint is not None else None

    def staging(self, stage: Stage) -> Stage:
        """``stage`` (the durable staging of an accepted update), counted if metrics are on."""
        return self.metrics.timed_staging(stage) if self.metrics is not None else stage

    def resumed(self, number: int, count: int) -> None:
        """``count`` staged updates of round ``number`` were kept over a restart."""
        if self.metrics is not None:
            self.metrics.resumed_updates(number, count)

    def start(self) -> None:
        """Serve the metrics and the dashboard, open the trackers; once (later calls do nothing).

        Raises
        ------
        geofl.server.metrics.MetricsAddressError
            If ``server.metrics.address`` cannot be bound.
        geofl.server.dashboard.DashboardAddressError
            If ``server.dashboard.address`` cannot be bound.
        ConfigError
            If MLflow's tracking URI cannot be used.
        """
        if self._started:
            return
        self._started = True
        if self.endpoint is not None:
            self.endpoint.start()
            log.info("run %s: metrics at %s", self._config.run.name, self.endpoint.url)
        if self.dashboard is not None:
            self.dashboard.start()
            log.info("run %s: dashboard at %s", self._config.run.name, self.dashboard.url)
        if self._mlflow is not None:
            self._mlflow.start()
        if self._tensorboard is not None:
            self._tensorboard.start(self._clock.time())

    def close(self, status: str) -> None:
        """The run ended with ``status``: close the trackers and stop serving; once."""
        if self._closed:
            return
        self._closed = True
        if self._figures is not None and self._started:
            self._figures.finish(status)
        if self.metrics is not None:
            self.metrics.close()
        if self.endpoint is not None:
            self.endpoint.stop()
        if self.dashboard is not None:
            self.dashboard.close(status)
