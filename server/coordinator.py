"""The coordinator: one run from configuration to the last round.

Composition root of the server: opens the database (migrating it), resumes
the run if the database holds an unfinished one with the same name and
configuration, serves gRPC, drives the round engine, tells every client the
run is over, and records the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy.orm import Session

from geofl.protocols.errors import GeoflError
from geofl.protocols.tensors import model_bytes, spec_of
from geofl.protocols.tuning import tune_allocator
from geofl.protocols.types import Scalar, Weights, WeightsView
from geofl.server.config import RunConfig, ServerConfig
from geofl.server.config.errors import ConfigError
from geofl.server.config.fields import is_loopback
from geofl.server.config.privacy import budget_problem
from geofl.server.control.admins import AdminKeys, AdminSessions
from geofl.server.control.service import ControlParts, ControlServicer, start_control_server
from geofl.server.dashboard import check_access
from geofl.server.instruments import RunInstruments
from geofl.server.lifecycle import RoundEvents, StopSwitch, choose_run, final_status
from geofl.server.models.loading import UserCodeError, load_initial_weights, load_server_evaluate
from geofl.server.models.spool import MemoryBudget
from geofl.server.models.staging import DurableUploads, ResumedUpdate
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import WALL_CLOCK, Clock, LoopLoad
from geofl.server.nodes.identity import AuthorizedNodes, JoinCheck
from geofl.server.nodes.registry import Registry
from geofl.server.nodes.revocation import RevokedCertificates
from geofl.server.privacy import DistributedMechanism, PrivacyError, check_float_model
from geofl.server.privacy.budget import BudgetGuard, PrivacyLedger
from geofl.server.rounds.factory import make_engine
from geofl.server.rounds.observers import Observers, RoundObserver
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.recorder import DatabaseRecorder
from geofl.server.rounds.records import EngineSettings, NoClientsError, RoundRecord
from geofl.server.rounds.secure import DistributedDpSettings, SecureSettings
from geofl.server.rounds.writer import InlineWriter, SerialWriter, Writer
from geofl.server.scheduling import LinkEstimator
from geofl.server.scheduling.partial_sync import LayerSyncPlanner, PartialSyncError
from geofl.server.scheduling.scheduler import Scheduler, SchedulerSettings
from geofl.server.scheduling.streaming import FragmentSchedule, StreamingError
from geofl.server.strategies import Strategy, make_strategy
from geofl.server.strategies.diloco import DiLoCo
from geofl.server.strategies.robust import RobustStrategy
from geofl.server.strategies.server_opt import ServerOptStrategy
from geofl.server.transport import CoordinatorServicer, ServerState, add_to_server
from geofl.server.transport.guard import Rejections, RpcGuard
from geofl.storage import (
    CheckpointRecord,
    CheckpointStore,
    Database,
    RunStatus,
    open_database,
    queries,
)

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 10.0
_MAX_PENDING_CALLS = 65_536  # calls gRPC may queue before the loop takes them up


class AddressInUseError(GeoflError):
    """The configured listen address cannot be bound."""


@dataclass(frozen=True)
class RunResult:
    """How a run ended."""

    run_id: int
    status: str
    resumed_from: int | None
    db_url: str
    error: str | None = None


def fragment_schedule(config: RunConfig) -> FragmentSchedule | None:
    """Streaming DiLoCo's fragments when ``schedule.streaming`` is on."""
    streaming = config.schedule.streaming
    if not streaming.enabled:
        return None
    return FragmentSchedule(
        streaming.count,
        config.local_steps // streaming.count,
        streaming.overlap_steps,
        streaming.mixing_alpha,
        streaming.groups,
    )


def build_strategy(config: RunConfig) -> Strategy:
    """The configured strategy with its own parameters (DiLoCo's outer optimizer in mode diloco)."""
    if config.schedule.mode == "diloco":
        diloco, partial = config.schedule.diloco, config.schedule.partial_sync
        layer_sync = (
            LayerSyncPlanner(
                partial.points,
                partial.groups,
                keep_local=partial.keep_local,
                tail_steps=partial.tail_for(config.local_steps),
            )
            if partial.enabled
            else None
        )
        return DiLoCo(
            outer_lr=diloco.outer_lr,
            outer_momentum=diloco.outer_momentum,
            layer_sync=layer_sync,
            streaming=fragment_schedule(config),
        )
    params: dict[str, Any] = config.strategy.model_dump()
    name = params.pop("name")
    for key in ("clients_per_round", "min_clients", "max_examples_per_client", "robust"):
        params.pop(key, None)
    strategy = make_strategy(name, **params)
    privacy, robust = config.privacy, config.strategy.robust
    if privacy is not None and privacy.is_distributed(config.secure_aggregation.enabled):
        return strategy  # the clients clip and noise; the server averages the noised sum
    if privacy is not None:  # the config refuses privacy with a robust rule or Flower
        assert isinstance(strategy, ServerOptStrategy)
        rule = privacy.build(config.strategy.clients_per_round, config.planned_rounds)
        return RobustStrategy(strategy, rule)
    if robust is None:
        return strategy
    assert isinstance(strategy, ServerOptStrategy)  # the config refuses Flower + robust
    return RobustStrategy(strategy, robust.build())


def privacy_ledger(config: RunConfig) -> PrivacyLedger | None:
    """The run's central-DP ledger (the same mechanism :func:`build_strategy` noises with);
    None without privacy or with distributed DP, whose ledger needs the model's size
    (:func:`distributed_plan`)."""
    privacy = config.privacy
    if privacy is None or privacy.is_distributed(config.secure_aggregation.enabled):
        return None
    mechanism = privacy.central_mechanism(config.strategy.clients_per_round, config.planned_rounds)
    return PrivacyLedger(mechanism, privacy.delta, privacy.target_epsilon)


def distributed_plan(
    config: RunConfig, dimension: int
) -> tuple[DistributedMechanism, DistributedDpSettings]:
    """Distributed DP for a model of ``dimension`` floats: the accounted mechanism and the
    settings every secure round sends to its clients.

    Raises
    ------
    PrivacyError
        If the ring is too small, no noise fits the target, or the target is exceeded.
    """
    privacy = config.privacy
    assert privacy is not None
    cohort, rounds = config.strategy.clients_per_round, config.planned_rounds
    mechanism = privacy.distributed_mechanism(
        cohort, rounds, dimension, config.secure_aggregation.ring_bits
    )
    problem = budget_problem(privacy, cohort, rounds, mechanism)
    if problem is not None:
        raise PrivacyError(f"distributed DP for a model of {dimension} floats: {problem}")
    settings = DistributedDpSettings(
        clip_norm=mechanism.clip_norm,
        granularity=mechanism.granularity,
        noise_stddev=mechanism.noise_stddev,
        rounding_bound=mechanism.rounding_bound,
        dimension=dimension,
        min_survivors=mechanism.min_survivors,
        denominator=cohort,
    )
    return mechanism, settings


def check_exposure(config: ServerConfig, source: str = "server") -> None:
    """Refuse to serve beyond loopback without TLS and node authentication.

    Raises
    ------
    ConfigError
        If ``config.address`` is not a loopback address, TLS or node authentication is
        missing, and ``server.insecure`` is not set; the message says what to add.
    """
    if config.insecure or is_loopback(config.host):
        return
    missing = []
    if config.tls is None:
        missing.append("TLS (server.tls)")
    if not config.authenticates:
        missing.append("node authentication (server.auth or server.tls.client_ca)")
    if not missing:
        return
    raise ConfigError.single(
        source,
        f"{config.address} listens beyond loopback without {' and '.join(missing)}: anyone "
        "who reaches the port could join under any name and submit updates. Configure them "
        "(see docs/security.md), or set server.insecure: true to accept the risk",
        path="server.address",
    )


def join_check(config: ServerConfig) -> JoinCheck:
    """How ``config``'s server checks joining nodes (loads ``server.auth.nodes`` and
    ``server.tls.crl``).

    Raises
    ------
    ConfigError
        If the authorized nodes or the CRL cannot be read or are invalid.
    """
    keys = AuthorizedNodes(Path(config.auth.nodes)) if config.auth is not None else None
    tls = config.tls
    mutual = tls is not None and tls.client_ca is not None
    revoked = None
    if tls is not None and tls.client_ca is not None and tls.crl is not None:
        revoked = RevokedCertificates(Path(tls.crl), Path(tls.client_ca))
    return JoinCheck(keys=keys, certificates=mutual, revoked=revoked)


def _credentials(config: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS credentials of ``config`` (verifying client certificates with a client CA)."""
    tls = config.tls
    if tls is None:
        return None
    pair = [(Path(tls.key).read_bytes(), Path(tls.cert).read_bytes())]
    if tls.client_ca is None:
        return grpc.ssl_server_credentials(pair)
    return grpc.ssl_server_credentials(
        pair, root_certificates=Path(tls.client_ca).read_bytes(), require_client_auth=True
    )


async def start_grpc_server(
    state: ServerState, config: ServerConfig
) -> tuple[grpc.aio.Server, int]:
    """Serve the Coordinator service for ``state`` on ``config.address``; returns the port.

    Shared by the coordinator and regional relays (which serve their region's clients).
    The port is bound exclusively (no SO_REUSEPORT): a second server on it fails.

    Raises
    ------
    ConfigError
        If the address is beyond loopback without TLS and authentication (see
        :func:`check_exposure`).
    AddressInUseError
        If the address cannot be bound.
    """
    check_exposure(config)
    server = grpc.aio.server(
        interceptors=[RpcGuard(state.rejections)],
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", 8 << 20),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
            # gRPC sheds calls that arrive faster than the event loop takes them up once
            # 1,000 wait (early drop; all beyond 3,000): a crowd of nodes joining at once
            # then sees CANCELLED joins. Bounded, but far beyond any join storm we serve.
            ("grpc.server.max_pending_requests", _MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", _MAX_PENDING_CALLS),
        ],
    )
    add_to_server(CoordinatorServicer(state), server)
    credentials = _credentials(config)
    try:
        if credentials is None:
            port = server.add_insecure_port(config.address)
        else:
            port = server.add_secure_port(config.address, credentials)
    except RuntimeError as exc:
        raise AddressInUseError(
            f"cannot listen on {config.address}: address already in use (is another geofl "
            "server or relay running on this port?)"
        ) from exc
    if port == 0:
        raise AddressInUseError(f"cannot listen on {config.address}: address already in use")
    await server.start()
    return server, port


async def watch_authorized_nodes(
    check: JoinCheck, registry: Registry, reload: asyncio.Event, interval_s: float = 1.0
) -> None:
    """Re-read the authorized keys and the CRL when a file changes or ``reload`` is set
    (SIGHUP), and end the session of every node whose key is gone or whose certificate
    is revoked; until cancelled."""
    if check.keys is None and check.revoked is None:
        return
    while True:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):  # not wait_for: it may swallow a cancel
                await reload.wait()
        forced = reload.is_set()
        reload.clear()
        if not check.refresh(force=forced):
            continue
        for session in registry.end_sessions(check.still_valid, "node credential revoked"):
            credential = session.identity.credential if session.identity else "-"
            log.warning("node %s (%s) revoked: session ended", session.name, credential)


#: A server at least this busy over a heartbeat interval (LoopLoad.share) was saturated.
SATURATED_SHARE = 0.9


async def reap_offline(registry: Registry, load: LoopLoad | None = None) -> None:
    """Mark nodes that stopped sending heartbeats offline, until cancelled.

    After an interval in which the event loop was saturated, silence says nothing: in a
    join storm (thousands of nodes joining at once, as after a coordinator restart) the
    first poll of a node that joined may wait in gRPC's queue longer than the patience,
    and expiring it would make it join again and feed the storm. Such an interval counts
    every node as heard (measured: 272 of 5,000 nodes were dropped so on one core).
    """
    load = load if load is not None else LoopLoad()  # made here: on the loop's thread
    while True:
        await asyncio.sleep(registry.heartbeat_interval_s)
        busy = load.share()
        if busy >= SATURATED_SHARE and not registry.clock.simulated:
            log.info("server saturated (%.0f %% busy): no node expired", 100 * busy)
            registry.forgive_silence()
            continue
        for node in registry.expire():
            log.info("node %d (%s) went offline", node.node_id, node.name)


async def shutdown_clients(registry: Registry, grace_s: float = _SHUTDOWN_GRACE_S) -> None:
    """Tell every online client the run is over; return once each has heard, or after grace."""
    registry.finished.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace_s
    while loop.time() < deadline:
        registry.expire()
        waiting = {s.node_id for s in registry.online()}
        if waiting <= registry.shutdown_delivered:
            break
        await asyncio.sleep(0.05)


class StagedUpdatesCleaner(RoundObserver):
    """Drops a round's staged updates once the round is over (committed or failed)."""

    def __init__(
        self, uploads: DurableUploads, writer: Writer | None = None, *, by_task: bool = False
    ) -> None:
        """``by_task``: FedBuff, whose updates go into whichever version is being built
        when they arrive: a version clears the staged rows of the tasks it recorded."""
        self._uploads = uploads
        self._writer = writer if writer is not None else InlineWriter()
        self._by_task = by_task

    def round_ended(self, record: RoundRecord, status: str) -> None:
        if self._by_task:
            tasks = [task.task_id for task, _ in record.outcomes if task.kind == "fit"]
            self._writer.submit(lambda: self._uploads.clear_tasks(tasks))
            return
        number = record.number
        self._writer.submit(lambda: self._uploads.clear_round(number))


def stages_uploads(config: RunConfig) -> bool:
    """Whether accepted updates are staged durably: the rounds that can fold them again.

    Synchronous, DiLoCo (partial sync included: its segments arrive as one update, staged
    once the trailer is in) and FedBuff rounds. Not secure aggregation: a masked vector is
    only unmasked by its round's SecAgg+ key agreement, whose secrets lived in the killed
    coordinator's memory (docs/architecture.md, "Durable rounds and database outages").
    Not streaming DiLoCo: a round's upload is one fragment of the model, which the staged
    update's full-model record does not describe.
    """
    return (
        config.storage.stage_uploads
        and not config.secure_aggregation.enabled
        and not config.schedule.streaming.enabled
    )


def buffers_updates(config: RunConfig) -> bool:
    """Whether the run is FedBuff's: staged updates belong to no one round."""
    return config.schedule.mode == "async"


class Coordinator:
    """Serves one run; ``await start()`` then ``await run()``."""

    def __init__(
        self,
        config: RunConfig,
        *,
        observers: Sequence[RoundObserver] = (),
        clock: Clock = WALL_CLOCK,
        listen: bool = True,
        new_run: bool = False,
    ) -> None:
        """``observers`` hear of every round after the database recorder has written it.

        ``listen=False`` serves no gRPC: the clients are simulated in process (they
        attach to :attr:`registry`). ``new_run`` starts a new run even when ``run.name``
        is taken by an ended one (else that is an error: see :mod:`geofl.server.lifecycle`).
        """
        self.config = config
        self.clock = clock
        self._listen = listen
        self._new_run = new_run
        self._observers = list(observers)
        self.stop_switch = StopSwitch()
        self.db: Database = open_database(config.storage.url, retry_s=config.storage.retry_s)
        self.store = CheckpointStore(Path(config.storage.checkpoints))
        self.strategy = build_strategy(config)
        self.ledger = privacy_ledger(config)
        self._ddp: DistributedDpSettings | None = None  # planned with the model
        self.registry = Registry(
            config.server.heartbeat_interval_s,
            clock=clock,
            selectable=config.schedule.selection.node_config,
        )
        #: The rounds' database work: on one worker thread when serving RPCs, so the event
        #: loop answers them while the database is away (see server/rounds/writer.py).
        self.writer: Writer = SerialWriter() if listen else InlineWriter()
        self.db.on_recovered = self._forgive_silence
        self.admin_sessions = self._admin_sessions()  # a bad admins file: before any run
        if config.server.dashboard is not None:  # a dashboard without login: as early
            check_access(config.server.dashboard, self._dashboard_sessions, config.run.name)
        self.weights, self.run_id, self.start_round = self._resume_or_create()
        self.uploads = DurableUploads(
            self.db, Path(config.storage.checkpoints), self.run_id, clock=clock
        )
        durable = listen and stages_uploads(config)
        partial = self.store.discard_partial_writes() + self.uploads.discard_partial_writes()
        if partial:
            log.info("deleted %d file(s) a killed server left half-written or unrecorded", partial)
        self._resumed: list[ResumedUpdate] = self._staged_before_restart() if durable else []
        upload_budget = MemoryBudget(config.server.upload_buffer_bytes)
        #: Metrics endpoint and experiment trackers (each only if configured).
        self.instruments = RunInstruments(
            config,
            self.registry,
            self.run_id,
            upload_budget,
            clock,
            db=self.db,
            sessions=self._dashboard_sessions,
        )
        self.instruments.resumed(self.start_round, len(self._resumed))
        if not durable:
            self.uploads.clear()
        elif self._resumed:
            log.info(
                "round %d: %d update(s) accepted before the restart will be folded again",
                self.start_round,
                len(self._resumed),
            )
        self._check_layer_sync(self.weights)
        self._check_private_model(self.weights)
        size = model_bytes(spec_of(self.weights))
        if size > config.server.max_model_bytes:
            raise UserCodeError(
                f"model {config.model!r} has {size} bytes, over server.max_model_bytes "
                f"({config.server.max_model_bytes})"
            )
        self.port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.control_port: int | None = None
        self._control: grpc.aio.Server | None = None
        self._server: grpc.aio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.reload_nodes = asyncio.Event()
        self._state = ServerState(
            registry=self.registry,
            run_id=self.run_id,
            run_name=config.run.name,
            spec=spec_of(self.weights),
            join_node=self._join_node,
            run_config=dict(config.round_config),
            models=ModelStore(
                config.server.chunk_bytes,
                tracks=config.compression.down_chains(),
                min_bytes=config.compression.min_bytes,
                seed=config.run.seed,
                changed_only=config.schedule.streaming.enabled,
            ),
            compression=config.compression,
            upload_budget=upload_budget,
            regions=frozenset(config.server.regions),
            join_check=join_check(config.server),
            on_refusal=self._record_refusal,
            stage_update=self.instruments.staging(self.uploads.stage) if durable else None,
        )

    # ------------------------------------------------------------ set-up

    def _resume_or_create(self) -> tuple[Weights, int, int]:
        cfg = self.config
        with self.db.session() as session:
            run = choose_run(session, cfg.run.name, cfg.config_sha256(), new_run=self._new_run)
            if run is None:
                weights = load_initial_weights(cfg.model)
                self._check_layer_sync(weights)  # before the run is recorded
                self._check_private_model(weights)
                run = queries.create_run(
                    session,
                    cfg.run.name,
                    cfg.to_dict(),
                    cfg.planned_rounds,
                    simulated_clock=self.clock.simulated,
                    digest=cfg.config_sha256(),
                    now=self.clock.now(),
                )
                queries.add_event(
                    session,
                    "run.started",
                    f"run '{cfg.run.name}' started",
                    run_id=run.id,
                    now=self.clock.now(),
                )
                return weights, run.id, 1
            run_id, last = run.id, run.last_committed_round
            checkpoint = queries.latest_checkpoint(session, run_id)
            queries.reopen_run(session, run_id, now=self.clock.now())
            queries.add_event(
                session,
                "run.resumed",
                f"resuming after round {last}",
                run_id=run_id,
                now=self.clock.now(),
            )
        if checkpoint is None:
            return load_initial_weights(cfg.model), run_id, 1
        weights, state = self.store.load(CheckpointRecord.from_row(checkpoint))
        self.strategy.load_state(state)
        log.info("resuming run %d after round %d", run_id, last)
        return weights, run_id, last + 1

    def _staged_before_restart(self) -> list[ResumedUpdate]:
        """The updates accepted before a restart that the first round folds again."""
        if buffers_updates(self.config):
            return self.uploads.buffered()
        return self.uploads.resumed(self.start_round, self.start_round - 1)

    def _check_layer_sync(self, weights: WeightsView) -> None:
        """A partial-sync or streaming schedule must fit the model before the first round."""
        fragments = getattr(self.strategy, "streaming", None)
        if isinstance(fragments, FragmentSchedule):
            try:
                fragments.groups(spec_of(weights))
            except StreamingError as exc:
                raise ConfigError.single(
                    self.config.run.name, str(exc), path="schedule.streaming"
                ) from exc
        layer_sync = getattr(self.strategy, "layer_sync", None)
        if not isinstance(layer_sync, LayerSyncPlanner):
            return
        try:
            layer_sync.groups(spec_of(weights))
        except PartialSyncError as exc:
            raise ConfigError.single(
                self.config.run.name, str(exc), path="schedule.partial_sync"
            ) from exc

    def _check_private_model(self, weights: WeightsView) -> None:
        """DP noises float tensors only: a model with others is refused up front. Distributed
        DP is planned (and its exact ε checked against the target) here, once the model's
        size is known."""
        privacy = self.config.privacy
        if privacy is None:
            return
        try:
            check_float_model(weights)
            if privacy.is_distributed(self.config.secure_aggregation.enabled):
                dimension = sum(int(w.size) for w in weights.values())
                mechanism, self._ddp = distributed_plan(self.config, dimension)
                self.ledger = PrivacyLedger(mechanism, privacy.delta, privacy.target_epsilon)
        except PrivacyError as exc:
            raise ConfigError.single(self.config.run.name, str(exc), path="privacy") from exc

    def _forgive_silence(self, waited_s: float) -> None:
        """The database is back: heartbeats missed meanwhile say nothing about the nodes.

        Called on whichever thread waited (the writer's, a staging thread, or the loop
        at start-up); the registry belongs to the event loop, so it is done there.
        """
        loop = self._loop
        on_loop = False
        with contextlib.suppress(RuntimeError):
            on_loop = asyncio.get_running_loop() is loop
        if loop is None or on_loop or loop.is_closed():
            self.registry.forgive_silence()
        else:
            loop.call_soon_threadsafe(self.registry.forgive_silence)

    def _join_node(self, name: str, region: str | None, node_config: dict[str, Scalar]) -> int:
        now = self.clock.now()
        return self.db.transact(
            lambda session: (
                queries.upsert_node(
                    session, self.run_id, name, region, dict(node_config), now=now
                ).id
            )
        )

    def _record_refusal(self, kind: str, details: dict[str, Scalar]) -> None:
        """Write a refused identity, forbidden request or replay to the run's events."""
        now = self.clock.now()
        self.db.transact(
            lambda session: queries.add_event(
                session,
                f"security.{kind}",
                str(details.get("reason", kind)),
                run_id=self.run_id,
                data=dict(details),
                now=now,
            )
        )

    def join_nodes(self, nodes: Sequence[tuple[str, str | None]]) -> list[int]:
        """Register many (simulated) nodes by (name, region) in one transaction; their ids."""
        now = self.clock.now()
        return self.db.transact(
            lambda session: queries.upsert_nodes(session, self.run_id, nodes, now=now)
        )

    @property
    def models(self) -> ModelStore:
        """The published model versions (what clients download)."""
        return self._state.models

    @property
    def rejections(self) -> Rejections:
        """Every RPC the server refused, counted by method and status."""
        return self._state.rejections

    async def start(self) -> int:
        """Bind the listen address and start serving; returns the bound port."""
        tune_allocator()
        self._loop = asyncio.get_running_loop()
        self._server, self.port = await start_grpc_server(self._state, self.config.server)
        self.instruments.start()  # first: the control API hands out the dashboard's URL
        await self._start_control()
        self._watch_authorized_nodes()
        log.info("serving run %s (id %d) on port %d", self.config.run.name, self.run_id, self.port)
        return self.port

    @property
    def _dashboard_sessions(self) -> AdminSessions | None:
        """What guards the dashboard: only a served control API hands out login links
        (a run without gRPC, the virtual clock's, has none: its dashboard is loopback-only)."""
        return self.admin_sessions if self._listen else None

    def _admin_sessions(self) -> AdminSessions | None:
        """The admins' sessions when ``server.control`` is set (also the dashboard's login).

        Raises
        ------
        ConfigError
            If ``server.control.admins`` cannot be read or is invalid.
        """
        control = self.config.server.control
        if control is None:
            return None
        self._admins = AdminKeys(Path(control.admins))
        return AdminSessions(ttl_s=control.session_ttl_s, still_admin=self._admins.is_admin)

    async def _start_control(self) -> None:
        """Serve the control API on ``server.control.address`` (if set)."""
        control, sessions = self.config.server.control, self.admin_sessions
        if control is None or sessions is None:
            return
        parts = ControlParts(
            self.db,
            self.store,
            self._admins,
            sessions,
            live=self,
            dashboard_url=self.instruments.dashboard_url,
        )
        self._control, self.control_port = await start_control_server(
            lambda: ControlServicer(parts), control, self.config.server
        )
        log.info("control API on port %d", self.control_port)

    def _watch_authorized_nodes(self) -> None:
        """Follow ``server.auth.nodes`` and ``server.tls.crl``: on file changes, and on
        SIGHUP in the main thread."""
        check = self._state.join_check
        if check.keys is None and check.revoked is None:
            return
        self._watcher = asyncio.create_task(
            watch_authorized_nodes(check, self.registry, self.reload_nodes)
        )
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
            loop.add_signal_handler(signal.SIGHUP, self.reload_nodes.set)

    # ------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        """Run the remaining rounds, then shut every client down."""
        if self._server is None and self._listen:
            await self.start()
        self.instruments.start()
        resumed = self.start_round - 1 if self.start_round > 1 else None
        if self.ledger is not None:  # the accountant's work, off the event loop
            await asyncio.to_thread(self.ledger.plan, self.config.planned_rounds)
        engine = make_engine(
            EngineSettings.from_config(self.config), self._engine_parts(), self.config.schedule
        )
        reaper = asyncio.create_task(reap_offline(self.registry))
        error: str | None = None
        try:
            await engine.run()
        except NoClientsError as exc:
            error = str(exc)
        except asyncio.CancelledError:  # SIGINT/SIGTERM: resumable
            self._record_end(RunStatus.INTERRUPTED, "interrupted (SIGINT/SIGTERM)")
            raise
        except Exception as exc:  # a crash: resumable once its cause is fixed, as after a kill
            with contextlib.suppress(Exception):  # the database may be what failed
                self._record_end(RunStatus.INTERRUPTED, f"crashed: {type(exc).__name__}: {exc}")
            raise
        finally:
            reaper.cancel()
        await self.writer.drain()  # every round's rows are written before the run's end
        status, error = final_status(self._committed_rounds(), self.stop_switch.reason, error)
        if not status.resumable:  # nothing staged will be folded: not after the last
            await asyncio.to_thread(self.uploads.close)  # version, nor by a restart
        self._record_end(status, error)
        self.instruments.close(status.value)
        await self._shutdown_clients()
        return RunResult(self.run_id, status.value, resumed, self.config.storage.url, error)

    def request_stop(self, reason: str) -> bool:
        """Stop the run after its current round (``geofl runs stop``): it ends
        ``cancelled``, its clients are told. Whether this was the first request."""
        first = self.stop_switch.request(reason)
        if first:
            log.warning("run %d: stop requested (%s)", self.run_id, reason)
            self._add_event("run.stop_requested", f"stop requested: {reason}")
        return first

    def _stop_for_budget(self, reason: str) -> None:
        """The next round would exceed ``privacy.target_epsilon``: end the run after this one."""
        self._add_event("privacy.budget_reached", reason)
        self.request_stop(reason)

    def _committed_rounds(self) -> int:
        return self.db.transact(
            lambda session: queries.get_run(session, self.run_id).last_committed_round
        )

    def _record_end(self, status: RunStatus, error: str | None) -> None:
        """The run's final (or interrupted) status and a ``run.<status>`` event."""
        now = self.clock.now()

        def write(session: Session) -> None:
            queries.finish_run(session, self.run_id, status, error, now=now)
            message = status.value + (f": {error}" if error else "")
            queries.add_event(session, f"run.{status.value}", message, run_id=self.run_id, now=now)

        self.db.transact(write)

    def _add_event(self, kind: str, message: str) -> None:
        now = self.clock.now()
        self.db.transact(
            lambda session: queries.add_event(session, kind, message, run_id=self.run_id, now=now)
        )

    def _engine_parts(self) -> EngineParts:
        """The engine's parts: this run's registry, strategy, models and observers."""
        config = self.config
        recorder = DatabaseRecorder(
            self.db,
            self.store,
            self.run_id,
            config.storage.keep_checkpoints,
            clock=self.clock,
            epsilon_after=self.ledger.epsilon_after if self.ledger else None,
            writer=self.writer,
        )
        guard = (
            [BudgetGuard(self.ledger, config.planned_rounds, self._stop_for_budget)]
            if self.ledger
            else []
        )
        return EngineParts(
            registry=self.registry,
            strategy=self.strategy,
            models=self._state.models,
            observer=Observers(
                [
                    recorder,
                    StagedUpdatesCleaner(
                        self.uploads, self.writer, by_task=buffers_updates(config)
                    ),
                    RoundEvents(self.db, self.run_id, self.clock, self.writer),
                    *guard,
                    *self.instruments.observers,
                    *self._observers,
                ]
            ),
            start_round=self.start_round,
            weights=self.weights,
            clock=self.clock,
            server_evaluate=(
                load_server_evaluate(config.evaluation.server) if config.evaluation.server else None
            ),
            compression=config.compression,
            secure=SecureSettings.from_config(config.secure_aggregation, self.run_id, self._ddp),
            scheduler=self._scheduler(),
            resumed=self._resumed,
            stop_requested=self.stop_switch.requested,
        )

    def _scheduler(self) -> Scheduler:
        """Measurements always; deadline-aware selection and adaptive codecs if configured."""
        config = self.config
        compression = config.compression
        estimator = LinkEstimator()
        with self.db.session() as session:
            estimator.load(queries.latest_measurements(session, self.run_id))
        settings = SchedulerSettings(
            selection=config.schedule.selection,
            deadline_s=config.schedule.deadline_s,
            over_select=config.schedule.over_select,
            model_bytes=model_bytes(spec_of(self.weights)),
            min_clients=config.strategy.min_clients,
            adaptive=compression.adaptive,
            min_bytes=compression.min_bytes,
            error_feedback=compression.error_feedback,
            max_staleness=compression.max_staleness,
        )
        return Scheduler(settings, estimator)

    async def _shutdown_clients(self) -> None:
        """Tell every online client the run is over, then stop serving."""
        if not self._listen:
            self.registry.finished.set()
            await self.stop()
            return
        await shutdown_clients(self.registry)
        await self.stop()

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving (the metrics too) and close the database."""
        self.instruments.close("interrupted")
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        for server in (self._server, self._control):
            if server is not None:
                with contextlib.suppress(Exception):
                    await server.stop(grace)
        self._server = self._control = None
        self.writer.close()
        self.db.close()


__all__ = [
    "AddressInUseError",
    "Coordinator",
    "RunResult",
    "StagedUpdatesCleaner",
    "buffers_updates",
    "build_strategy",
    "check_exposure",
    "distributed_plan",
    "is_loopback",
    "join_check",
    "privacy_ledger",
    "reap_offline",
    "shutdown_clients",
    "stages_uploads",
    "start_grpc_server",
    "watch_authorized_nodes",
]
