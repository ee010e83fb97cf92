"""How runs end and start again: completed, failed, cancelled, interrupted; name reuse."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.reporting import report_run
from geofl.server.config import RunConfig
from geofl.server.config.errors import ConfigError
from geofl.server.coordinator import Coordinator, RunResult
from geofl.storage import open_database, queries
from geofl.storage.models import Event, Run

from .conftest import run_config


def _runs(config: RunConfig) -> list[tuple[int, str, str | None]]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        return [(r.id, r.status, r.error) for r in session.scalars(select(Run).order_by(Run.id))]


def _event_kinds(config: RunConfig, run_id: int) -> list[str]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        rows = session.scalars(select(Event).where(Event.run_id == run_id).order_by(Event.id))
        return [e.kind for e in rows]


def _complete(serve: Any, config: RunConfig, clients: int = 2, **node: Any) -> RunResult:
    handle = serve(config)
    for i in range(clients):
        handle.add_client(i, **node)
    return handle.wait()  # type: ignore[no-any-return]


def test_completed_run_is_recorded_and_its_name_is_not_reused_silently(
    tmp_path: Path, serve: Any
) -> None:
    config = run_config(tmp_path, strategy={"clients_per_round": 2, "min_clients": 2})
    result = _complete(serve, config)
    assert result.status == "completed"
    assert report_run(result, []) == ExitCode.OK
    kinds = _event_kinds(config, result.run_id)
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed"
    assert kinds.count("round.committed") == 2
    with pytest.raises(ConfigError, match=r"already ended \(completed.*--new-run"):
        Coordinator(config)
    assert [r[0] for r in _runs(config)] == [result.run_id]  # nothing was created

    again = _complete(serve.new_run, config)  # what --new-run builds
    assert again.run_id != result.run_id and again.status == "completed"
    assert [(r[0], r[1]) for r in _runs(config)] == [
        (result.run_id, "completed"),
        (again.run_id, "completed"),
    ]


class Serve:
    """``serve(config)`` as in conftest, remembering the loop each coordinator runs on."""

    def __init__(self, serve_coordinator: Any) -> None:
        self._serve = serve_coordinator
        self.loops: dict[int, asyncio.AbstractEventLoop] = {}

    def __call__(self, config: RunConfig, new_run: bool = False) -> Any:
        def make() -> Coordinator:
            coordinator = Coordinator(config, new_run=new_run)
            self.loops[id(coordinator)] = asyncio.get_running_loop()
            return coordinator

        return self._serve(make)

    def new_run(self, config: RunConfig) -> Any:
        return self(config, new_run=True)

    def loop(self, handle: Any) -> asyncio.AbstractEventLoop:
        return self.loops[id(handle.coordinator)]


@pytest.fixture
def serve(serve_coordinator: Any) -> Serve:
    return Serve(serve_coordinator)


def test_a_run_whose_every_round_failed_fails_and_exits_1(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path, run={"rounds": 1}, strategy={"clients_per_round": 2, "min_clients": 2}
    )
    result = _complete(serve, config, behaviour="raise")
    assert (result.status, result.error) == ("failed", "no round committed (every round failed)")
    assert report_run(result, []) == ExitCode.RUN_FAILED
    assert _runs(config) == [(result.run_id, "failed", result.error)]
    assert _event_kinds(config, result.run_id)[-2:] == ["round.failed", "run.failed"]


def test_a_stopped_run_ends_its_round_tells_its_clients_and_is_cancelled(
    tmp_path: Path, serve: Any
) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 50},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    handle = serve(config)
    for i in range(2):
        handle.add_client(i, behaviour="slow", delay_s=0.2)
    _wait_for_commit(config, handle.coordinator.run_id)
    loop = serve.loop(handle)
    first = asyncio.run_coroutine_threadsafe(_stop(handle.coordinator), loop).result(10)
    again = asyncio.run_coroutine_threadsafe(_stop(handle.coordinator), loop).result(10)
    assert (first, again) == (True, False)
    result = handle.wait()  # the clients exit: they were told the run is over
    assert (result.status, result.error) == ("cancelled", "operator test")
    assert report_run(result, []) == ExitCode.CANCELLED
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        run = queries.get_run(session, result.run_id)
        assert 1 <= run.last_committed_round < 50
        assert run.finished_at is not None
        rounds = queries.run_detail(session, result.run_id).rounds
        assert [r.status for r in rounds] == ["committed"] * len(rounds)  # none left running
    kinds = _event_kinds(config, result.run_id)
    assert "run.stop_requested" in kinds and kinds[-1] == "run.cancelled"


async def _stop(coordinator: Coordinator) -> bool:
    return coordinator.request_stop("operator test")


def _wait_for_commit(config: RunConfig, run_id: int, rounds: int = 1) -> None:
    deadline = time.monotonic() + 60
    while True:
        with open_database(config.storage.url, migrate=False) as db, db.session() as session:
            if queries.get_run(session, run_id).last_committed_round >= rounds:
                return
        assert time.monotonic() < deadline, "no round committed"
        time.sleep(0.05)


def test_an_interrupted_run_is_marked_and_resumes(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"rounds": 50},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    handle = serve(config)
    for i in range(2):
        handle.add_client(i, behaviour="slow", delay_s=0.2)
    _wait_for_commit(config, handle.coordinator.run_id)
    handle.result.cancel()  # what SIGINT/SIGTERM do to the serving task
    deadline = time.monotonic() + 30
    while _runs(config)[0][1] != "interrupted":
        assert time.monotonic() < deadline, _runs(config)
        time.sleep(0.05)
    run_id, _, error = _runs(config)[0]
    assert error == "interrupted (SIGINT/SIGTERM)"
    asyncio.run_coroutine_threadsafe(handle.coordinator.stop(), serve.loop(handle)).result(10)

    # Same name and configuration: carries the run on, also when it is now watched
    # (a metrics endpoint and a tracker are not part of what the run computes).
    watched = run_config(
        tmp_path,
        run={"rounds": 50},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
        server={"address": "127.0.0.1:0", "metrics": {"address": "127.0.0.1:0"}},
        tracking={"tensorboard": {"log_dir": str(tmp_path / "tb")}},
    )
    assert watched.config_sha256() == config.config_sha256()
    resumed = Coordinator(watched)
    try:
        assert resumed.run_id == run_id and resumed.start_round > 1
        assert _runs(config) == [(run_id, "running", None)]
    finally:
        resumed.db.close()
    changed = run_config(
        tmp_path,
        run={"rounds": 49},
        evaluation={"every": 0},
        strategy={"clients_per_round": 2, "min_clients": 2},
    )
    with pytest.raises(ConfigError, match=r"another configuration.*--new-run"):
        Coordinator(changed)
