"""Where virtual clients' jobs run: in this process, or in a few worker processes.

A backend takes :class:`~geofl.server.simulation.workers.Job` objects and returns futures
of their results. Jobs carry a *priority* (the simulated time at which their result is
needed) and each lane runs the most urgent job first, so the workers train ahead of the
simulated clock in the order the simulation will ask for results. A client always goes to
the same lane (``index % lanes``), so its context ``state`` and its error-feedback
residual live in one place across rounds.

Submitting does not freeze simulated time; the simulated client that needs a result
waits for it with :func:`geofl.server.simulation.virtual_loop.real_work`, which does.

Jobs and model versions reach worker processes through ``multiprocessing`` pipes
(pickled): local inter-process communication between geofl's own processes, never data
that came from a network.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import queue
import threading
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection
from typing import Any, Protocol

from geofl.protocols.errors import GeoflError
from geofl.protocols.types import Weights
from geofl.server.simulation.workers import (
    ClientWorker,
    Job,
    JobResult,
    ModelKey,
    WorkerSetup,
    superseded,
)

__all__ = [
    "Backend",
    "BackendError",
    "InlineBackend",
    "LaneBackend",
    "ProcessBackend",
    "make_backend",
]

log = logging.getLogger(__name__)

_STOP = object()


class BackendError(GeoflError):
    """The simulation's workers could not start (e.g. the client app does not import)."""


class _Runner(Protocol):
    def has_model(self, key: ModelKey) -> bool: ...
    def add_model(self, key: ModelKey, weights: Weights) -> None: ...
    def run(self, job: Job) -> JobResult: ...
    def close(self) -> None: ...


class Backend(ABC):
    """Runs jobs of virtual clients."""

    #: How many jobs can run at once.
    lanes: int

    @abstractmethod
    async def start(self) -> None:
        """Start the workers; :class:`BackendError` if they cannot."""

    @abstractmethod
    def submit(self, job: Job, weights: Weights, priority: float) -> asyncio.Future[JobResult]:
        """Queue ``job`` (on model ``weights``, known as ``job.model``); its result later."""

    @abstractmethod
    async def close(self) -> None:
        """Stop the workers (pending jobs are abandoned)."""


class _Lane:
    """A thread feeding one runner from a priority queue."""

    def __init__(self, name: str, runner: _Runner, loop: asyncio.AbstractEventLoop) -> None:
        self._runner = runner
        self._loop = loop
        self._queue: queue.PriorityQueue[tuple[float, int, Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def put(self, priority: float, item: tuple[Job, Weights, asyncio.Future[JobResult]]) -> None:
        self._queue.put((priority, next(self._order), item))

    def stop(self) -> None:
        self._queue.put((float("inf"), next(self._order), _STOP))
        self._thread.join(timeout=30)
        self._runner.close()

    def _serve(self) -> None:
        while True:
            _, _, item = self._queue.get()
            if item is _STOP:
                return
            job, weights, future = item
            if future.cancelled():
                continue
            try:
                if not self._runner.has_model(job.model):
                    self._runner.add_model(job.model, weights)
                result = self._runner.run(job)
            except Exception as exc:  # the worker itself broke (not the user's code)
                log.exception("simulation worker failed")
                result = JobResult("failed", f"simulation worker failed: {exc}")
            self._loop.call_soon_threadsafe(_resolve, future, result)


def _resolve(future: asyncio.Future[JobResult], result: JobResult) -> None:
    if not future.done():
        future.set_result(result)


class LaneBackend(Backend):
    """Jobs spread over lanes by client index; subclasses say what a lane runs."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self._lanes: list[_Lane] = []

    @abstractmethod
    def _runner(self, index: int) -> _Runner:
        """The runner of lane ``index`` (called from :meth:`start`, in a thread)."""

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        runners = await asyncio.gather(
            *(asyncio.to_thread(self._runner, i) for i in range(self.lanes)),
            return_exceptions=True,
        )
        failures = [r for r in runners if isinstance(r, BaseException)]
        ok = [r for r in runners if not isinstance(r, BaseException)]
        if failures:
            for runner in ok:
                runner.close()
            raise BackendError(f"simulation workers could not start: {failures[0]}") from (
                failures[0]
            )
        self._lanes = [_Lane(f"geofl-sim-{i}", r, loop) for i, r in enumerate(ok)]

    def submit(self, job: Job, weights: Weights, priority: float) -> asyncio.Future[JobResult]:
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        self._lanes[job.client.index % len(self._lanes)].put(priority, (job, weights, future))
        return future

    async def close(self) -> None:
        lanes, self._lanes = self._lanes, []
        await asyncio.gather(*(asyncio.to_thread(lane.stop) for lane in lanes))


class _LocalRunner(ClientWorker):
    def close(self) -> None:
        """Nothing to release."""


class InlineBackend(LaneBackend):
    """One lane in this process (``simulation.workers: 0``): simplest to debug."""

    def __init__(self, setup: WorkerSetup) -> None:
        super().__init__(1)
        self._setup = setup

    def _runner(self, index: int) -> _Runner:
        try:
            return _LocalRunner(self._setup)
        except Exception as exc:
            raise BackendError(str(exc)) from exc


class _ProcessRunner:
    """A worker process driven over a pipe."""

    def __init__(self, setup: WorkerSetup, name: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_worker_main, args=(child, setup), name=name, daemon=True
        )
        self._process.start()
        child.close()
        self._models: set[ModelKey] = set()
        status = self._receive()
        if status[0] != "ready":
            self.close()
            raise BackendError(f"{name}: {status[1]}")

    def _receive(self) -> Any:
        try:
            return self._conn.recv()
        except (EOFError, OSError) as exc:
            code = self._process.exitcode
            raise BackendError(f"worker process exited (code {code})") from exc

    def has_model(self, key: ModelKey) -> bool:
        return key in self._models

    def add_model(self, key: ModelKey, weights: Weights) -> None:
        self._conn.send(("model", key, dict(weights)))
        self._models = (self._models - set(superseded(self._models, key))) | {key}

    def run(self, job: Job) -> JobResult:
        self._conn.send(("job", job))
        result: JobResult = self._receive()
        return result

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._conn.send(None)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(timeout=5)
        self._conn.close()


def _worker_main(conn: Connection, setup: WorkerSetup) -> None:
    """Entry point of a worker process."""
    try:
        worker = ClientWorker(setup)
    except Exception as exc:  # e.g. the client app does not import
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        if message[0] == "model":
            worker.add_model(message[1], message[2])
        else:
            conn.send(worker.run(message[1]))


class ProcessBackend(LaneBackend):
    """``workers`` processes, each multiplexing many clients (the default)."""

    def __init__(self, setup: WorkerSetup, workers: int) -> None:
        super().__init__(workers)
        self._setup = setup

    def _runner(self, index: int) -> _Runner:
        return _ProcessRunner(self._setup, f"geofl-sim-worker-{index}")


def make_backend(kind: str, setup: WorkerSetup, workers: int) -> Backend:
    """The backend ``simulation.backend`` names, with ``workers`` lanes (0: in process)."""
    if kind == "ray":
        from geofl.server.simulation.ray_backend import RayBackend

        return RayBackend(setup, max(1, workers))
    if workers == 0:
        return InlineBackend(setup)
    return ProcessBackend(setup, workers)
