"""The relay's downstream half: geofl's own server pieces, serving one region's clients.

The servicer, registry and model store are the coordinator's, on a private event loop in
a thread. Each task from the coordinator becomes a fresh synchronous engine
(``make_engine``) over the region's clients, with an in-memory recorder instead of a
database: the coordinator records the relay's participation, and the relay's local rounds
are its "training".

Local model versions are planned by :class:`~geofl.server.relay.rounds.VersionPlan`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Coroutine, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import grpc

from geofl.protocols.tensors import model_bytes, spec_of
from geofl.protocols.types import Metrics, Scalar, Weights
from geofl.server.config.robust import regional_strategy
from geofl.server.coordinator import (
    join_check,
    reap_offline,
    shutdown_clients,
    start_grpc_server,
    watch_authorized_nodes,
)
from geofl.server.models.spool import MemoryBudget
from geofl.server.models.store import ModelStore
from geofl.server.nodes.registry import Registry
from geofl.server.relay.config import RelayConfig
from geofl.server.relay.rounds import (
    MemoryRecorder,
    RegionalError,
    RegionalEvaluation,
    RegionalResult,
    UpstreamTask,
    VersionPlan,
    local_budget,
    regional_round_config,
)
from geofl.server.rounds.factory import make_engine
from geofl.server.rounds.observers import Observers, RoundObserver
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import EngineSettings, NoClientsError, RoundRecord
from geofl.server.rounds.secure import SecureSettings
from geofl.server.rounds.sync import SyncEngine
from geofl.server.scheduling.scheduler import Scheduler, SchedulerSettings
from geofl.server.transport import ServerState

__all__ = ["RegionalServer"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class RegionalServer:
    """Serves one region's clients; the coordinator's tasks become regional rounds.

    Methods other than the coroutines are called from the relay's main thread and block
    until the work on the relay's event loop is done.
    """

    def __init__(self, config: RelayConfig) -> None:
        self._config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="geofl-relay-loop", daemon=True
        )
        self._versions = VersionPlan(config.relay.local_rounds)
        # One strategy for every task: a robust rule's memory carries across them.
        self._strategy = regional_strategy(config.relay.robust)
        # Measurements of the region's clients outlive each task's engine.
        self._scheduler: Scheduler | None = None
        self._node_ids: dict[str, int] = {}
        self._server: grpc.aio.Server | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._state: ServerState | None = None
        self.port: int | None = None

    # ------------------------------------------------------------ life cycle

    def start(self) -> int:
        """Start the loop and bind ``server.address``; returns the bound port.

        Raises
        ------
        geofl.server.coordinator.AddressInUseError
            If the address cannot be bound.
        """
        if not self._thread.is_alive():
            self._thread.start()
        try:
            self.port = self._call(self._start())
        except BaseException:
            self._close_loop()
            raise
        return self.port

    async def _start(self) -> int:
        server = self._config.server
        registry = Registry(server.heartbeat_interval_s)
        self._state = ServerState(
            registry=registry,
            run_id=0,  # the coordinator's run id, once a task brings it
            run_name=self._config.node_name,
            spec=(),  # the model's, once a task brings it
            join_node=self._join_node,
            models=ModelStore(server.chunk_bytes),
            upload_budget=MemoryBudget(server.upload_buffer_bytes),
            join_check=join_check(server),  # the region's clients authenticate as at a server
        )
        self._server, port = await start_grpc_server(self._state, server)
        self._reaper = asyncio.create_task(reap_offline(registry))
        self._watcher = asyncio.create_task(
            watch_authorized_nodes(self._state.join_check, registry, asyncio.Event())
        )
        return port

    def stop(self, *, run_over: bool) -> None:
        """Stop serving; with ``run_over`` tell the region's clients first."""
        if self._thread.is_alive():
            self._call(self._stop(run_over))
        self._close_loop()

    async def _stop(self, run_over: bool) -> None:
        if run_over and self._state is not None:
            await shutdown_clients(self._state.registry)
        for task in (self._reaper, self._watcher):
            if task is not None:
                task.cancel()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.stop(1.0)

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)
        if not self._loop.is_running():
            self._loop.close()

    def _call(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Run ``work`` on the relay's loop and wait; Ctrl-C in the caller cancels it."""
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _join_node(self, name: str, region: str | None, node_config: dict[str, Scalar]) -> int:
        """Node ids by name, stable while the relay runs (a rejoin keeps its id)."""
        if region is not None and region != self._config.relay.region:
            log.warning("client %s says it is in %s, not %s", name, region, self._region)
        return self._node_ids.setdefault(name, len(self._node_ids) + 1)

    @property
    def _region(self) -> str:
        return self._config.relay.region

    @property
    def state(self) -> ServerState:
        """The servicer's state (for inspection in tests)."""
        if self._state is None:
            raise RuntimeError("the regional server has not started")
        return self._state

    def online_clients(self) -> int:
        """Local clients connected now."""

        async def count() -> int:
            return len(self.state.registry.online())

        return self._call(count())

    def set_run_config(self, run_config: Mapping[str, Scalar]) -> None:
        """What local clients are told at join: the coordinator's run configuration."""

        async def assign() -> None:
            self.state.run_config = dict(run_config)

        self._call(assign())

    # ------------------------------------------------------------ tasks

    def fit(
        self, weights: Weights, config: Mapping[str, Scalar], task: UpstreamTask
    ) -> RegionalResult:
        """Run ``local_rounds`` regional rounds from ``weights``; blocks until done."""
        return self._call(self._fit(weights, dict(config), task))

    def evaluate(
        self, weights: Weights, config: Mapping[str, Scalar], task: UpstreamTask
    ) -> RegionalEvaluation:
        """Federated evaluation of ``weights`` on the region's clients; blocks until done."""
        return self._call(self._evaluate(weights, dict(config), task))

    async def _fit(
        self, weights: Weights, config: dict[str, Scalar], task: UpstreamTask
    ) -> RegionalResult:
        first, last = self._versions.rounds(task.model_version)
        rounds = self._config.relay.local_rounds
        budget = local_budget(_remaining(task), self._config.schedule, rounds)
        recorder = MemoryRecorder()
        settings = self._settings(last, budget, regional_round_config(config), evaluate=False)
        engine = make_engine(settings, self._parts(weights, task, settings, recorder, first))
        try:
            await engine.run()
        except NoClientsError as exc:
            if not recorder.committed:
                raise self._too_few(exc) from exc
            log.warning("regional rounds cut short after %d: %s", len(recorder.committed), exc)
        finally:
            for version in range(first - 1, last + 1):
                self.state.models.drop(version)
        return recorder.result()

    async def _evaluate(
        self, weights: Weights, config: dict[str, Scalar], task: UpstreamTask
    ) -> RegionalEvaluation:
        version = self._versions.base(task.model_version)
        budget = local_budget(_remaining(task), self._config.schedule, 1)
        settings = self._settings(version, budget, regional_round_config(config), evaluate=True)
        parts = self._parts(weights, task, settings, MemoryRecorder(), version + 1)
        try:
            record = await SyncEngine(settings, parts).evaluate_only(version)
        except NoClientsError as exc:
            raise self._too_few(exc) from exc
        finally:
            self.state.models.drop(version)
        done = [o for t, o in record.outcomes if t.kind == "evaluate" and o.status == "ok"]
        if not done or record.eval_loss is None:
            reasons = "; ".join(sorted({o.reason or o.status for _, o in record.outcomes}))
            raise RegionalError(f"no local client evaluated: {reasons or 'none selected'}")
        total = sum(o.num_examples for o in done)
        metrics: Metrics = {**record.eval_metrics, "relay_clients": len(done)}
        return RegionalEvaluation(record.eval_loss, total, metrics)

    def _too_few(self, error: NoClientsError) -> RegionalError:
        return RegionalError(f"region {self._region} has too few local clients (regional {error})")

    def _settings(
        self,
        rounds: int,
        budget: tuple[float, float],
        config: dict[str, Scalar],
        *,
        evaluate: bool,
    ) -> EngineSettings:
        """The engine's settings for one task; the cohort is everyone unless configured."""
        relay = self._config.relay
        online = len(self.state.registry.online())
        return EngineSettings.regional(
            self._config.schedule,
            rounds=rounds,
            cohort=relay.clients_per_round or max(relay.min_clients, online),
            min_clients=relay.min_clients,
            budget=budget,
            config=config,
            evaluate=evaluate,
            seed=relay.seed,
        )

    def _parts(
        self,
        weights: Weights,
        task: UpstreamTask,
        settings: EngineSettings,
        recorder: MemoryRecorder,
        start_round: int,
    ) -> EngineParts:
        """A fresh engine's parts over the region's clients, for one task from upstream."""
        size = model_bytes(spec_of(weights))
        if size > self._config.server.max_model_bytes:
            raise RegionalError(
                f"the model has {size} bytes, over server.max_model_bytes "
                f"({self._config.server.max_model_bytes})"
            )
        state = self.state
        state.run_id, state.spec = task.run_id, spec_of(weights)
        secure = SecureSettings.from_config(self._config.secure_aggregation, task.run_id)
        if secure is not None:  # each stage must fit in the coordinator's deadline too
            secure = replace(
                secure, stage_deadline_s=min(secure.stage_deadline_s, settings.deadline_s)
            )
        return EngineParts(
            registry=state.registry,
            strategy=self._strategy,
            models=state.models,
            observer=Observers([recorder, _RegionalLog(self._region)]),
            start_round=start_round,
            weights=weights,
            secure=secure,
            scheduler=self._regional_scheduler(settings, size),
        )

    def _regional_scheduler(self, settings: EngineSettings, size: int) -> Scheduler:
        """The run's selection policy over this region's clients, under this task's deadline.

        Deadline-aware selection then works from the relay's own measurements of its
        clients (kept across tasks), as the coordinator's does for its nodes.
        """
        scheduler_settings = SchedulerSettings(
            selection=self._config.schedule.selection,
            deadline_s=settings.deadline_s,
            over_select=settings.over_select,
            model_bytes=size,
            min_clients=settings.min_clients,
        )
        if self._scheduler is None:
            self._scheduler = Scheduler(scheduler_settings)
        self._scheduler.settings = scheduler_settings
        return self._scheduler


class _RegionalLog(RoundObserver):
    """Logs how each regional round ended."""

    def __init__(self, region: str) -> None:
        self._region = region

    def round_ended(self, record: RoundRecord, status: str) -> None:
        ok = sum(1 for task, o in record.outcomes if task.kind == "fit" and o.status == "ok")
        log.info(
            "region %s: local round %d %s, %d clients", self._region, record.number, status, ok
        )


def _remaining(task: UpstreamTask) -> float | None:
    """Seconds until the coordinator's deadline (clocks are assumed in sync, as for clients)."""
    if task.deadline_unix_s is None:
        return None
    return task.deadline_unix_s - time.time()
