"""The coordinator of a Flower app: geofl's server, with a ServerApp driving the rounds.

The composition mirrors :class:`geofl.server.coordinator.Coordinator`: open the
database, serve gRPC (clients connect and long-poll as for any geofl run), wait for
``run.min_nodes`` nodes (as Flower's simulation registers every node before its
ServerApp starts), run, tell every client the run is over, record the outcome.  The
difference is who drives: the ServerApp runs unchanged in its own thread with a
:class:`~.grid.GeoflGrid` and a Flower ``Context`` whose ``run_config`` is the app's
config; its messages become tasks, and its rounds are recorded like native ones
(:mod:`.recording`), with what its strategy computes on the server
(:mod:`.strategy_results`).

A Flower run is not resumable: the strategy's state lives inside the ServerApp, so a
restarted server starts a new run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from flwr.app import Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from geofl.protocols.tuning import tune_allocator
from geofl.protocols.types import Scalar
from geofl.server.config.errors import ConfigError
from geofl.server.coordinator import (
    AddressInUseError,
    RunResult,
    join_check,
    reap_offline,
    start_grpc_server,
    watch_authorized_nodes,
)
from geofl.server.flower.app_dir import ConfigValue, FlowerApp
from geofl.server.flower.config import FlowerRunConfig
from geofl.server.flower.grid import GeoflGrid
from geofl.server.flower.hub import MessageHub
from geofl.server.flower.recording import RoundBook
from geofl.server.flower.strategy_results import install as record_strategy_results
from geofl.server.flower.strategy_results import reporting_to
from geofl.server.models.spool import MemoryBudget
from geofl.server.models.store import ModelStore
from geofl.server.nodes.registry import Registry
from geofl.server.rounds.observers import Observers, RoundObserver
from geofl.server.transport import ServerState
from geofl.storage import Database, open_database, queries

__all__ = ["FlowerCoordinator"]

log = logging.getLogger(__name__)

_SHUTDOWN_GRACE_S = 10.0
#: After a failed run: nodes busy in a handler do not poll; do not wait long for them.
_FAILED_GRACE_S = 2.0
_NODE_POLL_S = 0.05
_ROUNDS_KEY = "num-server-rounds"


class FlowerCoordinator:
    """Serves one run of a Flower app; ``await start()`` then ``await run()``.

    Parameters
    ----------
    app
        The app directory's description (names, components).
    server_app
        The loaded ``components.serverapp``.
    run_config
        The app's run config, overrides applied; the ServerApp's ``context.run_config``
        and every client's.
    settings
        geofl's settings (storage, server, simulation).
    observers
        Hear of each round's end (``round_ended``) when it is committed or failed.
    """

    def __init__(
        self,
        app: FlowerApp,
        server_app: ServerApp,
        run_config: Mapping[str, ConfigValue],
        settings: FlowerRunConfig,
        *,
        observers: Sequence[RoundObserver] = (),
    ) -> None:
        self.app = app
        self.settings = settings
        self.run_config = dict(run_config)
        self._server_app = server_app
        self._observers = Observers(observers)
        self.run_name = settings.run.name or _run_name(app.name)
        self.db: Database = open_database(settings.storage.url)
        self.registry = Registry(settings.server.heartbeat_interval_s)
        self.run_id = 0  # the run is created by start()
        self.port: int | None = None
        self._server: grpc.aio.Server | None = None
        self._hub: MessageHub | None = None
        self._aborted: asyncio.Event | None = None
        self._abort_reason = "aborted"
        #: Whether the ServerApp's thread has started (every awaited node had joined).
        self.serverapp_started = False
        shared: dict[str, Scalar] = dict(self.run_config)  # every client's run config
        self._state = ServerState(
            registry=self.registry,
            run_id=0,
            run_name=self.run_name,
            spec=(),
            join_node=self._join_node,
            run_config=shared,
            models=ModelStore(settings.server.chunk_bytes),
            upload_budget=MemoryBudget(settings.server.upload_buffer_bytes),
            max_message_bytes=settings.server.max_model_bytes,
            join_check=join_check(settings.server),
        )
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ set-up

    def _create_run(self) -> int:
        record: dict[str, Any] = {
            "flower_app": {
                "fab_id": self.app.fab_id,
                "version": self.app.version,
                "serverapp": self.app.serverapp,
                "clientapp": self.app.clientapp,
            },
            "run_config": self.run_config,
            **self.settings.to_dict(),
        }
        rounds = self.run_config.get(_ROUNDS_KEY)
        planned = rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else 0
        with self.db.session() as session:
            return queries.create_run(session, self.run_name, record, max(planned, 0)).id

    def _join_node(self, name: str, region: str | None, node_config: dict[str, Scalar]) -> int:
        with self.db.session() as session:
            return queries.upsert_node(session, self.run_id, name, region, dict(node_config)).id

    def _flower_run(self) -> Run:
        return dataclasses.replace(
            Run.create_empty(self.run_id),
            fab_id=self.app.fab_id,
            fab_version=self.app.version,
            override_config=dict(self.run_config),
        )

    async def start(self) -> int:
        """Bind the listen address and start serving; returns the bound port."""
        tune_allocator()
        self.run_id = self._state.run_id = self._create_run()
        try:
            self._server, self.port = await start_grpc_server(self._state, self.settings.server)
        except (AddressInUseError, ConfigError) as exc:
            with self.db.session() as session:
                queries.finish_run(session, self.run_id, "failed", str(exc))
            raise
        self._watcher = asyncio.create_task(
            watch_authorized_nodes(self._state.join_check, self.registry, asyncio.Event())
        )
        log.info(
            "serving Flower app %s (run %d) on port %d", self.app.fab_id, self.run_id, self.port
        )
        return self.port

    # ------------------------------------------------------------ the run

    async def run(self) -> RunResult:
        """Wait for ``run.min_nodes`` nodes, run the ServerApp to its end, shut clients down."""
        if self._server is None:
            await self.start()
        loop = asyncio.get_running_loop()
        rounds = RoundBook(self.db, self.run_id, self._observers)
        hub = self._hub = MessageHub(self.registry, self._state.models, rounds)
        aborted = self._aborted = asyncio.Event()
        done: asyncio.Future[None] = loop.create_future()
        grid = GeoflGrid(hub, loop, self._flower_run())
        thread = threading.Thread(
            target=self._main, args=(grid, loop, done), daemon=True, name="geofl-serverapp"
        )
        reaper = asyncio.create_task(reap_offline(self.registry))
        abort_wait = asyncio.ensure_future(aborted.wait())
        try:
            missing = await self._wait_for_nodes(abort_wait)
            if missing is None:
                self.serverapp_started = True
                record_strategy_results()
                thread.start()
                status, error = await self._outcome(done, abort_wait)
            else:
                status, error = "failed", missing
        except asyncio.CancelledError:
            self._record_end(hub, rounds, "failed", "interrupted")
            raise
        finally:
            reaper.cancel()
            abort_wait.cancel()
        self._record_end(hub, rounds, status, error)
        await self._shutdown_clients(
            _SHUTDOWN_GRACE_S if status == "completed" else _FAILED_GRACE_S
        )
        return RunResult(self.run_id, status, None, self.settings.storage.url, error)

    async def _wait_for_nodes(self, aborted: asyncio.Future[Any]) -> str | None:
        """Wait until ``min_nodes`` nodes are online; None, or why the run cannot start.

        Flower's simulation registers every node before its ServerApp starts, so a
        strategy's first sampling sees the whole federation; a ServerApp started earlier
        samples whoever happened to have joined.
        """
        need = self.settings.run.min_nodes or 0
        limit = self.settings.run.wait_for_nodes_s
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        if need:
            log.info("waiting for %d nodes to join before the ServerApp starts", need)
        while True:
            self.registry.expire()
            joined = len(self.registry.online())
            if joined >= need:
                return None
            if aborted.done():
                return self._abort_reason
            if loop.time() >= deadline:
                return (
                    f"only {joined} of {need} nodes joined within {limit:g} s "
                    "(run.wait_for_nodes_s); the ServerApp was not started"
                )
            await asyncio.wait({aborted}, timeout=_NODE_POLL_S)

    async def _outcome(
        self, done: asyncio.Future[None], aborted: asyncio.Future[Any]
    ) -> tuple[str, str | None]:
        """Wait for the ServerApp to end (or an abort); the run's status and error."""
        await asyncio.wait({done, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():  # aborted: the ServerApp's thread is a daemon, left behind
            return "failed", self._abort_reason
        exc = done.exception()
        if exc is None:
            return "completed", None
        log.error("the ServerApp failed", exc_info=exc)
        return "failed", f"the ServerApp raised {type(exc).__name__}: {exc}"

    def abort(self, reason: str) -> None:
        """End the run now as failed with ``reason`` (e.g. every client process died)."""
        self._abort_reason = reason
        if self._hub is not None:
            self._hub.close(reason)
        if self._aborted is not None:
            self._aborted.set()

    def _main(
        self, grid: GeoflGrid, loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]
    ) -> None:
        """The ServerApp's thread: run it, hand its outcome to the loop."""
        # Flower's Message constructor reads the sending process's identity from here.
        TaskIdentity.task_id = self.run_id
        TaskIdentity.run_id = self.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        context = Context(
            run_id=self.run_id,
            node_id=SUPERLINK_NODE_ID,
            node_config={},
            state=RecordDict(),
            run_config=dict(self.run_config),
        )
        outcome: BaseException | None = None
        try:
            with reporting_to(grid):
                self._server_app(grid, context)
        except BaseException as exc:  # handed to the loop, which records it
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            loop.call_soon_threadsafe(_resolve, done, outcome)

    def _record_end(
        self, hub: MessageHub, rounds: RoundBook, status: str, error: str | None
    ) -> None:
        hub.close("the run is over")
        rounds.finish(error)
        with self.db.session() as session:
            queries.finish_run(session, self.run_id, status, error)

    async def _shutdown_clients(self, grace_s: float) -> None:
        """Tell every online client the run is over (for ``grace_s`` at most), stop serving."""
        self.registry.finished.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while loop.time() < deadline:
            self.registry.expire()
            waiting = {s.node_id for s in self.registry.online()}
            if waiting <= self.registry.shutdown_delivered:
                break
            await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self, grace: float = 1.0) -> None:
        """Stop serving and close the database."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.stop(grace)
            self._server = None
        self.db.close()


def _resolve(done: asyncio.Future[None], outcome: BaseException | None) -> None:
    if done.done():
        return
    if outcome is None:
        done.set_result(None)
    elif isinstance(outcome, Exception):
        done.set_exception(outcome)
    else:  # SystemExit and the like must not unwind the event loop
        done.set_exception(RuntimeError(f"the ServerApp exited with {outcome!r}"))


def _run_name(name: str) -> str:
    """A run name from a project name: letters, digits, '_', '.' and '-' only."""
    cleaned = "".join(c if c.isalnum() or c in "_.-" else "-" for c in name)[:128]
    return cleaned or "flower-app"
