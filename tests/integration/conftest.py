"""Harness for integration tests: a real coordinator on loopback gRPC, real clients.

The coordinator runs on its own event loop in a thread; clients run the real
runtime in threads (or as processes in the CLI tests).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from geofl.client.app import load_client_app
from geofl.client.runtime import ClientOptions, ClientRuntime
from geofl.server.config import RunConfig, parse_config
from geofl.server.coordinator import Coordinator, RunResult
from geofl.server.simulation.links import LinkModel
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries
from geofl.storage.models import Node, Participation, Round, Run

APPS = Path(__file__).parent / "apps"
#: How far a stored duration may be from its exact value: it is the difference of two
#: timestamps the database keeps to the microsecond, each rounded by up to half of one
#: (and a hair more for the float arithmetic). Two stored durations: twice this.
STORED_DURATION_ABS = 1.01e-6


@pytest.fixture(autouse=True)
def _test_apps_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(APPS))


def run_config(tmp_path: Path, **sections: Any) -> RunConfig:
    """A small run of the test app with its database and checkpoints under ``tmp_path``."""
    data: dict[str, Any] = {
        "run": {"name": "itest", "rounds": 2, "seed": 1},
        "model": "geofl_testapp:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": 3, "min_clients": 2},
        "schedule": {"deadline_s": 20, "wait_for_clients_s": 20},
        "evaluation": {"every": 1, "server": "geofl_testapp:server_evaluate"},
        "storage": {
            "url": f"sqlite:///{tmp_path / 'geofl.db'}",
            "checkpoints": str(tmp_path / "ckpt"),
        },
        "server": {"address": "127.0.0.1:0", "heartbeat_interval_s": 0.5},
    }
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return parse_config(data, source="itest")


def virtual_run_config(
    tmp_path: Path,
    clients: int,
    *,
    node_config: dict[str, Any] | None = None,
    simulation: dict[str, Any] | None = None,
    **sections: Any,
) -> RunConfig:
    """:func:`run_config` on the virtual clock: ``clients`` simulated clients of the test
    app's ``virtual_app`` in the server process, a long deadline (virtual seconds cost
    nothing), no federated evaluation (the server's own only).

    ``node_config`` is every client's (e.g. ``{"scaled-ids": "7", "scale": 1e6}``);
    ``simulation`` adds or replaces keys of the ``simulation`` section (relays, regions).
    """
    defaults: dict[str, Any] = {
        "schedule": {"deadline_s": 600, "wait_for_clients_s": 5},
        "evaluation": {"every": 0, "server": "geofl_testapp:server_evaluate"},
    }
    section: dict[str, Any] = {
        "clients": clients,
        "app": "geofl_testapp:virtual_app",
        "clock": "virtual",
        "workers": 0,
    }
    if node_config is not None:
        section["node_config"] = node_config
    section.update(simulation or {})
    return run_config(tmp_path, **{**defaults, **sections, "simulation": section})


@dataclass
class ServerHandle:
    coordinator: Coordinator
    port: int
    result: Future[RunResult]
    clients: list[threading.Thread] = field(default_factory=list)
    runtimes: list[ClientRuntime] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def add_client(
        self,
        partition: int,
        app: str = "geofl_testapp:client_app",
        region: str | None = None,
        runtime_class: type[ClientRuntime] = ClientRuntime,
        **node_config: Any,
    ) -> ClientRuntime:
        options = ClientOptions(
            server=f"127.0.0.1:{self.port}",
            node_name=f"node-{partition}",
            node_config={"partition-id": partition, **node_config},
            reconnect_for_s=10,
            region=region,
        )
        runtime = runtime_class(options, load_client_app(app))

        def serve() -> None:
            try:
                runtime.run()
            except BaseException as exc:  # surfaced by wait()
                self.errors.append(exc)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        self.clients.append(thread)
        self.runtimes.append(runtime)
        return runtime

    def wait(self, timeout: float = 60) -> RunResult:
        result = self.result.result(timeout=timeout)
        for thread in self.clients:
            thread.join(timeout=15)
            assert not thread.is_alive(), "a client did not exit after the run"
        assert not self.errors, self.errors
        return result


@pytest.fixture
def serve_coordinator() -> Iterator[Any]:
    """``serve_coordinator(make)``: the coordinator ``make()`` builds, started and run on its
    own event loop in a thread (``make`` runs on that loop); returns a :class:`ServerHandle`."""
    loops: list[tuple[asyncio.AbstractEventLoop, threading.Thread]] = []

    def start(make: Callable[[], Any]) -> ServerHandle:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        loops.append((loop, thread))

        async def boot() -> tuple[Any, int]:
            coordinator = make()
            return coordinator, await coordinator.start()

        coordinator, port = asyncio.run_coroutine_threadsafe(boot(), loop).result(30)
        result = asyncio.run_coroutine_threadsafe(coordinator.run(), loop)
        return ServerHandle(coordinator, port, result)  # type: ignore[arg-type]

    yield start
    for loop, thread in loops:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def serve(serve_coordinator: Any) -> Any:
    """``serve(config)`` starts a coordinator in a thread; returns a :class:`ServerHandle`."""
    return lambda config: serve_coordinator(lambda: Coordinator(config))


def final_weights(config: RunConfig, run_id: int | None = None) -> dict[str, np.ndarray]:
    """The latest checkpoint's weights; without ``run_id``, of the database's only run."""
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        if run_id is None:
            run_id = session.scalars(select(Run.id)).one()
        row = queries.latest_checkpoint(session, run_id)
        assert row is not None
        record = CheckpointRecord.from_row(row)
    weights, _ = CheckpointStore(Path(config.storage.checkpoints)).load(record)
    return dict(weights)


def run_rows(config: RunConfig) -> tuple[Run, list[Round], list[tuple[Participation, Node]]]:
    """The run's row, its rounds in order, and every participation with its node."""
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            run = session.scalars(select(Run)).one()
            rounds = list(session.scalars(select(Round).order_by(Round.number)))
            pairs = [
                (p, n)
                for p, n in session.execute(
                    select(Participation, Node).join(Node, Participation.node_id == Node.id)
                )
            ]
            session.expunge_all()
        return run, rounds, pairs
    finally:
        db.close()


def link_model(config: RunConfig) -> LinkModel:
    """The WAN model the simulator draws from this configuration."""
    return LinkModel.from_config(config.simulation, config.run.seed)
