"""``simulation.backend: ray``: virtual clients' jobs on the actors of a local Ray instance.

The quickstart example is imported as ``examples.*`` with the repository root on
``sys.path`` (the backend hands the driver's ``sys.path`` to its actors, as spawned worker
processes inherit it). Most tests share one local Ray (two CPUs); the end-to-end run lets
the backend start and stop its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import sys
import textwrap
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import ray

from geofl.protocols.types import Scalar, Weights
from geofl.server.config import load_config
from geofl.server.simulation.backends import BackendError, make_backend
from geofl.server.simulation.ray_backend import (
    LOCAL_START_ATTEMPTS,
    DispatchQueue,
    PendingJob,
    RayBackend,
    _init_ray,
)
from geofl.server.simulation.virtual import VirtualRun, run_virtual_simulation
from geofl.server.simulation.workers import ClientIdentity, Job, JobResult, WorkerSetup
from geofl.storage import RunDetail, open_database
from geofl.storage.queries import run_detail

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART_APP = "examples.quickstart.task:client_app"
#: Fits seed torch per job, so results do not depend on which worker ran which job first.
FIT_CONFIG: dict[str, Scalar] = {"local_epochs": 1, "lr": 0.05, "batch_size": 32, "seed": 3}
#: Generous bounds so a regression fails instead of hanging the suite.
RUN_TIMEOUT_S = 240
JOB_TIMEOUT_S = 60


# ------------------------------------------------------------------ fixtures


@pytest.fixture(autouse=True)
def _repo_root_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray's own ResourceWarnings and GPU FutureWarning (the suite turns warnings to errors)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.simplefilter("ignore", FutureWarning)
        try:
            yield
        finally:
            gc.collect()  # Ray's leaked handles, now rather than in a later test


@pytest.fixture(scope="module")
def _ray_module() -> Iterator[None]:
    yield
    if ray.is_initialized():
        with _quiet_ray():
            ray.shutdown()


@pytest.fixture
def local_ray(_ray_module: None, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A local Ray with at least two CPUs, started by the test (not by the backend)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _init_ray(ray, 2)  # with its retry of a local start that did not come up
    return ray


@pytest.fixture
def no_ray(_ray_module: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray running and no cluster address: the backend starts a local one itself."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        with _quiet_ray():
            ray.shutdown()


def _write_config(tmp_path: Path, backend: str, round_config: dict[str, Scalar]) -> Path:
    folder = tmp_path / backend
    folder.mkdir()
    path = folder / "run.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            run: {{name: ray-test, rounds: 2, seed: 7}}
            model: examples.quickstart.task:make_model
            strategy: {{name: fedavg, clients_per_round: 8, min_clients: 6}}
            round_config: {json.dumps(round_config)}
            evaluation: {{every: 1, server: examples.quickstart.task:server_evaluate}}
            storage:
              url: sqlite:///{folder / "runs.db"}
              checkpoints: {folder / "checkpoints"}
            simulation:
              clients: 8
              clock: virtual
              backend: {backend}
              workers: 2
              app: {QUICKSTART_APP}
            """
        )
    )
    return path


def _simulate(path: Path) -> tuple[VirtualRun, RunDetail]:
    run = run_virtual_simulation(load_config(path))
    database = open_database(run.result.db_url)
    try:
        with database.session() as session:
            return run, run_detail(session, run.result.run_id)
    finally:
        database.close()


def _rounds(detail: RunDetail) -> list[tuple[Any, ...]]:
    return [
        (r.number, r.status, r.num_succeeded, r.train_loss, r.eval_loss, r.server_eval_loss)
        for r in detail.rounds
    ]


def _participations(detail: RunDetail) -> list[tuple[Any, ...]]:
    return sorted(
        (p.round_number, p.kind, p.node_name, p.status, p.num_examples, p.loss, p.bytes_up)
        for p in detail.participations
    )


# ------------------------------------------------------------------ end to end


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_ray_run_is_simulated_and_matches_the_process_backend(no_ray: None, tmp_path: Path) -> None:
    ray_run, ray_detail = _simulate(_write_config(tmp_path, "ray", FIT_CONFIG))
    assert not ray.is_initialized(), "the backend must stop the Ray instance it started"
    process_run, process_detail = _simulate(_write_config(tmp_path, "process", FIT_CONFIG))

    assert ray_run.result.status == "completed", ray_run.result.error
    assert ray_detail.run.simulated_clock
    assert [r.status for r in ray_detail.rounds] == ["committed", "committed"]
    assert all(r.num_succeeded == 8 for r in ray_detail.rounds)
    assert ray_run.stats.jobs == 32  # 8 clients x (fit + evaluate) x 2 rounds
    # Same seeds, same jobs: every loss and every participation is identical.
    assert _rounds(ray_detail) == _rounds(process_detail)
    assert _participations(ray_detail) == _participations(process_detail)
    assert ray_run.simulated_s == process_run.simulated_s


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_client_app_raising_in_fit_fails_its_participations(
    local_ray: ModuleType, tmp_path: Path
) -> None:
    broken = {**FIT_CONFIG, "batch_size": 0}  # the quickstart client raises ValueError
    run, detail = _simulate(_write_config(tmp_path, "ray", broken))

    assert run.result.status == "failed"
    assert run.result.error == "no round committed (every round failed)"
    assert [r.status for r in detail.rounds] == ["failed", "failed"]
    fits = [p for p in detail.participations if p.kind == "fit"]
    assert len(fits) == 16
    assert {p.status for p in fits} == {"failed"}
    assert all("ValueError" in (p.reason or "") and "batch_size" in (p.reason or "") for p in fits)


# ------------------------------------------------------------------ the backend itself


def _setup(app: str = QUICKSTART_APP) -> WorkerSetup:
    return WorkerSetup(app=app, run_config={}, node_config={}, num_clients=8)


def _job(client: int, task_id: int, config: dict[str, Scalar] | None = None) -> Job:
    who = ClientIdentity(client, client + 1, f"sim-{client}", None)
    return Job(who, "fit", ("", 1, ()), dict(config or FIT_CONFIG), None, 1, 1, task_id)


def _record(finished: list[int], task_id: int, _: object) -> None:
    finished.append(task_id)


def _weights() -> Weights:
    from examples.quickstart.task import make_model

    return make_model()


async def _started(backend: RayBackend) -> RayBackend:
    await backend.start()
    return backend


def test_make_backend_builds_a_ray_backend_with_one_actor_per_worker() -> None:
    backend = make_backend("ray", _setup(), 3)
    assert isinstance(backend, RayBackend)
    assert backend.lanes == 3
    assert make_backend("ray", _setup(), 0).lanes == 1


def test_a_bad_app_path_is_a_backend_error_at_start(local_ray: ModuleType) -> None:
    backend = RayBackend(_setup("examples.quickstart.no_such_module:client_app"), 2)
    with pytest.raises(BackendError, match=r"could not start.*no_such_module"):
        asyncio.run(backend.start())
    assert ray.is_initialized(), "a Ray the backend did not start must stay up"


def test_without_ray_installed_start_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(BackendError, match=r"pip install 'geofl\[ray\]'"):
        asyncio.run(RayBackend(_setup(), 1).start())


class _FlakyRay:
    """Stands in for the ``ray`` module: ``init`` fails its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, **options: Any) -> None:
        self.calls.append(f"init {options.get('address')}")
        if self.failures:
            self.failures -= 1
            raise Exception("The current node timed out during startup.")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


def test_a_local_ray_that_does_not_come_up_is_started_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flaky = _FlakyRay(failures=1)
    assert _init_ray(flaky, 2) is True
    assert flaky.calls == ["init local", "shutdown", "init local"]


def test_a_local_ray_failing_every_start_is_a_backend_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    flaky = _FlakyRay(failures=LOCAL_START_ATTEMPTS)
    with pytest.raises(BackendError, match="could not start a local Ray: The current node timed"):
        _init_ray(flaky, 2)
    assert flaky.calls.count("init local") == LOCAL_START_ATTEMPTS


def test_a_cluster_address_is_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cluster someone else runs is not ours to shut down and start again."""
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    flaky = _FlakyRay(failures=1)
    with pytest.raises(BackendError, match=r"RAY_ADDRESS=10\.0\.0\.9:6379"):
        _init_ray(flaky, 2)
    assert flaky.calls == ["init 10.0.0.9:6379"]


def test_submit_before_start_is_refused() -> None:
    async def submit() -> None:
        RayBackend(_setup(), 1).submit(_job(0, 1), _weights(), 0.0)

    with pytest.raises(RuntimeError, match="before start"):
        asyncio.run(submit())


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_one_actor_runs_queued_jobs_most_urgent_first(local_ray: ModuleType) -> None:
    async def scenario() -> tuple[list[int], list[JobResult]]:
        backend = await _started(RayBackend(_setup(), 1, in_flight=1))
        finished: list[int] = []
        try:
            weights = _weights()
            futures = []
            # Job 1 is sent at once; the rest wait and must leave in priority order.
            for task_id, priority in [(1, 9.0), (2, 5.0), (3, 1.0), (4, 3.0), (5, 1.0)]:
                future = backend.submit(_job(task_id % 8, task_id), weights, priority)
                future.add_done_callback(partial(_record, finished, task_id))
                futures.append(future)
            results = await asyncio.wait_for(asyncio.gather(*futures), JOB_TIMEOUT_S)
        finally:
            await backend.close()
        return finished, results

    finished, results = asyncio.run(scenario())
    assert finished == [1, 3, 5, 4, 2]
    assert [r.status for r in results] == ["ok"] * 5
    assert all(r.num_examples > 0 and r.tensors for r in results)


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_a_crashed_actor_fails_its_jobs_instead_of_hanging(
    local_ray: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "geofl_crashing_app.py").write_text(
        textwrap.dedent(
            """\
            import os

            from examples.quickstart.task import client_app as digits_app


            def client_app(context):
                client = digits_app(context)
                if context.node_config["partition-id"] == 0:
                    client.fit = lambda parameters, config: os._exit(3)
                return client
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    async def scenario() -> tuple[JobResult, JobResult]:
        backend = await _started(RayBackend(_setup("geofl_crashing_app:client_app"), 2))
        try:
            weights = _weights()
            crashed = backend.submit(_job(0, 1), weights, 0.0)  # actor 0's process exits
            healthy = backend.submit(_job(1, 2), weights, 0.0)  # actor 1 is unaffected
            return await asyncio.wait_for(asyncio.gather(crashed, healthy), JOB_TIMEOUT_S)
        finally:
            await backend.close()

    crashed, healthy = asyncio.run(scenario())
    assert crashed.status == "failed"
    assert crashed.error is not None and "simulation worker failed" in crashed.error
    assert healthy.status == "ok"


@pytest.mark.timeout(RUN_TIMEOUT_S)
def test_close_cancels_jobs_still_waiting(local_ray: ModuleType) -> None:
    async def scenario() -> list[asyncio.Future[JobResult]]:
        backend = await _started(RayBackend(_setup(), 1, in_flight=1))
        weights = _weights()
        futures = [backend.submit(_job(0, task), weights, float(task)) for task in range(3)]
        await backend.close()
        return futures

    futures = asyncio.run(scenario())
    assert all(future.cancelled() for future in futures)


# ------------------------------------------------------------------ the driver-side queue


def _pending(loop: asyncio.AbstractEventLoop, task_id: int) -> PendingJob:
    return PendingJob(_job(0, task_id), [], loop.create_future())


def _ids(jobs: Iterator[PendingJob] | list[PendingJob]) -> list[int]:
    return [pending.job.task_id for pending in jobs]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def test_queue_sends_lowest_priority_first_and_ties_in_submission_order(
    loop: asyncio.AbstractEventLoop,
) -> None:
    queue = DispatchQueue(limit=10)
    for task_id, priority in [(1, 4.0), (2, 2.0), (3, 4.0), (4, 0.5), (5, 2.0)]:
        queue.push(priority, _pending(loop, task_id))
    assert _ids(queue.take()) == [4, 2, 5, 1, 3]
    assert len(queue) == 0 and queue.in_flight == 5


def test_queue_keeps_at_most_limit_in_flight(loop: asyncio.AbstractEventLoop) -> None:
    queue = DispatchQueue(limit=2)
    jobs = {task_id: _pending(loop, task_id) for task_id in range(1, 5)}
    for task_id, pending in jobs.items():
        queue.push(float(-task_id), pending)  # the last pushed is the most urgent
    assert _ids(queue.take()) == [4, 3]
    assert _ids(queue.take()) == []  # full until a call returns
    queue.finished(jobs[4])
    queue.push(-10.0, _pending(loop, 9))  # arrives later but is the most urgent now
    assert _ids(queue.take()) == [9]
    assert queue.in_flight == 2 and len(queue) == 2


def test_queue_drops_jobs_nobody_waits_for(loop: asyncio.AbstractEventLoop) -> None:
    queue = DispatchQueue(limit=1)
    given_up, wanted = _pending(loop, 1), _pending(loop, 2)
    queue.push(0.0, given_up)
    queue.push(1.0, wanted)
    given_up.future.cancel()
    assert _ids(queue.take()) == [2]


def test_queue_drain_returns_queued_and_in_flight_jobs(loop: asyncio.AbstractEventLoop) -> None:
    queue = DispatchQueue(limit=1)
    for task_id in (1, 2, 3):
        queue.push(float(task_id), _pending(loop, task_id))
    assert _ids(queue.take()) == [1]
    assert sorted(_ids(queue.drain())) == [1, 2, 3]
    assert len(queue) == 0 and queue.in_flight == 0


def test_queue_and_backend_reject_nonsense_sizes() -> None:
    with pytest.raises(ValueError, match="limit"):
        DispatchQueue(limit=0)
    with pytest.raises(ValueError, match="actor"):
        RayBackend(_setup(), 0)
    with pytest.raises(ValueError, match="in_flight"):
        RayBackend(_setup(), 1, in_flight=0)
