"""Virtual clients' jobs as Ray actors (``simulation.backend: ray``).

Each actor wraps one :class:`~geofl.server.simulation.workers.ClientWorker`, so it does
what a worker process of :class:`~geofl.server.simulation.backends.ProcessBackend` does,
on whichever machines the Ray cluster has. A client always goes to the same actor
(``index % actors``), so its context ``state`` and its error-feedback residual stay in
one place across rounds.

Ray runs an actor's calls in the order they are sent, so the order is decided here, on
the driver: each actor has a :class:`DispatchQueue` that keeps at most a few calls in
flight and sends the most urgent job (lowest priority: the simulated time its result is
needed) next. Results resolve asyncio futures through the event loop's thread-safe
callbacks; submitting never freezes simulated time (the fleet's
:func:`~geofl.server.simulation.virtual_loop.real_work` does, while it waits).

Each model version is put in Ray's object store once and handed to actors as a
reference; an actor fetches a version the first time one of its jobs needs it (on one
machine the actors share that copy).

Without ``RAY_ADDRESS`` the backend starts a private local Ray instance (and stops it on
:meth:`RayBackend.close`); with it, it connects to that cluster, whose nodes need geofl
and the client app installed. An already initialised Ray (e.g. by the caller) is used as
it is. Ray serializes jobs and results with pickle: between this process and its own
local workers, or between the machines of the user's own Ray cluster.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import heapq
import itertools
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

from geofl.protocols.types import Weights
from geofl.server.simulation.backends import Backend, BackendError
from geofl.server.simulation.virtual_loop import real_work
from geofl.server.simulation.workers import (
    ClientWorker,
    Job,
    JobResult,
    ModelKey,
    WorkerSetup,
    superseded,
)

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["DEFAULT_IN_FLIGHT", "DispatchQueue", "PendingJob", "RayBackend"]

log = logging.getLogger(__name__)

#: A local Ray start is tried this many times. Ray waits a fixed 30 s for its raylet to
#: register; on a loaded two-core machine the raylet was once never heard from
#: (no log at all), while the next start a moment later came up at once.
LOCAL_START_ATTEMPTS = 2

#: Calls sent to one actor ahead of its results: one running, one ready to start, so the
#: actor never idles on a round trip while later (more urgent) jobs can still overtake.
DEFAULT_IN_FLIGHT = 2
#: Longest error text kept in a failed result (as :class:`ClientWorker` does).
MAX_ERROR_CHARS = 2000
INSTALL_HINT = "pip install 'geofl[ray]'"


@dataclass(eq=False)
class PendingJob:
    """A job waiting for, or running on, an actor."""

    job: Job
    #: ``[ref]`` of the model version in the object store; in a list so that Ray passes
    #: the reference itself and the actor fetches the weights only if it lacks them.
    model: list[ObjectRef[Weights]]
    future: asyncio.Future[JobResult]


class DispatchQueue:
    """One actor's jobs: most urgent first, at most ``limit`` sent and not yet finished.

    Ties in priority go in submission order. Jobs whose future is already done (the
    simulated client gave up on them) are dropped instead of sent.
    """

    def __init__(self, limit: int = DEFAULT_IN_FLIGHT) -> None:
        if limit < 1:
            raise ValueError(f"an actor needs at least one call in flight, got limit={limit}")
        self.limit = limit
        self._heap: list[tuple[float, int, PendingJob]] = []
        self._order = itertools.count()
        self._sent: set[PendingJob] = set()

    def __len__(self) -> int:
        """Jobs waiting to be sent."""
        return len(self._heap)

    @property
    def in_flight(self) -> int:
        """Jobs sent whose results have not come back."""
        return len(self._sent)

    def push(self, priority: float, pending: PendingJob) -> None:
        """Queue ``pending``; the lower ``priority``, the sooner it is sent."""
        heapq.heappush(self._heap, (priority, next(self._order), pending))

    def take(self) -> Iterator[PendingJob]:
        """The jobs to send now, each counted in flight as it is taken."""
        while self._heap and len(self._sent) < self.limit:
            _, _, pending = heapq.heappop(self._heap)
            if pending.future.done():
                continue
            self._sent.add(pending)
            yield pending

    def finished(self, pending: PendingJob) -> None:
        """``pending``'s call returned (or failed): room for another."""
        self._sent.discard(pending)

    def drain(self) -> list[PendingJob]:
        """Forget every job, queued or in flight, and return them."""
        pending = [item for _, _, item in self._heap] + list(self._sent)
        self._heap.clear()
        self._sent.clear()
        return pending


class ClientActor:
    """What runs inside each Ray actor: a :class:`ClientWorker` that caches model versions.

    Construction never raises, so that :meth:`ready` can say why the worker could not be
    built (e.g. the client app does not import) in a plain message.
    """

    def __init__(self, setup: WorkerSetup, search_path: list[str]) -> None:
        _extend_path(search_path)
        self._worker: ClientWorker | None = None
        self._error: str | None = None
        try:
            self._worker = ClientWorker(setup)
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> str | None:
        """None if the worker was built, else why not."""
        return self._error

    def run(self, job: Job, model: list[ObjectRef[Weights]]) -> JobResult:
        """Run ``job``, fetching its model version first if this actor lacks it."""
        if self._worker is None:
            return JobResult("failed", f"simulation worker did not start: {self._error}")
        if not self._worker.has_model(job.model):
            import ray

            # Read-only views of the object store, shared by the actors of a node: the
            # worker copies the weights for each job (fit_update), never writes these.
            self._worker.add_model(job.model, ray.get(model[0]))
        return self._worker.run(job)


def _extend_path(search_path: list[str]) -> None:
    """Make the driver's import locations (e.g. the app's folder) importable here too."""
    missing = [p for p in search_path if p not in sys.path and os.path.isdir(p)]
    sys.path[:0] = missing


class RayBackend(Backend):
    """``actors`` Ray actors, each multiplexing many clients.

    Parameters
    ----------
    setup:
        What every worker needs to build clients.
    actors:
        How many actors (each reserves one CPU of the Ray cluster).
    in_flight:
        Calls sent to one actor ahead of its results.
    """

    def __init__(
        self, setup: WorkerSetup, actors: int, *, in_flight: int = DEFAULT_IN_FLIGHT
    ) -> None:
        if actors < 1:
            raise ValueError(f"the Ray backend needs at least one actor, got {actors}")
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, got {in_flight}")
        self.lanes = actors
        self._setup = setup
        self._in_flight = in_flight
        self._ray: ModuleType | None = None
        self._started_ray = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._actors: list[Any] = []
        self._queues: list[DispatchQueue] = []
        self._models: dict[ModelKey, ObjectRef[Weights]] = {}

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start (or join) Ray and build the actors; :class:`BackendError` if they fail.

        Starting a local Ray blocks the event loop for a few seconds; nothing runs yet.
        """
        ray = _import_ray()
        self._ray = ray
        self._loop = asyncio.get_running_loop()
        self._started_ray = _init_ray(ray, self.lanes)
        try:
            _check_cpus(ray, self.lanes)
            self._actors = self._create_actors(ray)
            await self._await_ready()
        except BaseException:
            await self.close()
            raise
        self._queues = [DispatchQueue(self._in_flight) for _ in self._actors]

    def _create_actors(self, ray: ModuleType) -> list[Any]:
        actor_class = ray.remote(num_cpus=1, max_restarts=0)(ClientActor)
        search_path = [os.path.abspath(entry or os.curdir) for entry in sys.path]
        return [actor_class.remote(self._setup, search_path) for _ in range(self.lanes)]

    async def _await_ready(self) -> None:
        answers = await real_work(
            asyncio.gather(
                *(asyncio.wrap_future(actor.ready.remote().future()) for actor in self._actors),
                return_exceptions=True,
            )
        )
        for index, answer in enumerate(answers):
            if isinstance(answer, BaseException):
                raise BackendError(
                    f"Ray actor {index} could not start: {_first_lines(answer)}"
                ) from answer
            if answer is not None:
                raise BackendError(f"simulation workers could not start: {answer}")

    async def close(self) -> None:
        """Abandon pending jobs, kill the actors, and stop Ray if this backend started it."""
        for queue in self._queues:
            for pending in queue.drain():
                pending.future.cancel()
        actors, self._actors = self._actors, []
        self._queues = []
        self._models.clear()
        ray, self._ray = self._ray, None
        if ray is None:
            return
        for actor in actors:
            with contextlib.suppress(Exception):  # already dead is as good as killed
                ray.kill(actor, no_restart=True)
        if self._started_ray:
            self._started_ray = False
            with _quiet_ray():
                ray.shutdown()

    # ------------------------------------------------------------ jobs

    def submit(self, job: Job, weights: Weights, priority: float) -> asyncio.Future[JobResult]:
        """Queue ``job`` on its client's actor; its result later."""
        if self._ray is None or self._loop is None or not self._queues:
            raise RuntimeError("RayBackend.submit before start() (or after close())")
        future: asyncio.Future[JobResult] = self._loop.create_future()
        index = job.client.index % len(self._queues)
        model = [self._model_ref(self._ray, job.model, weights)]
        self._queues[index].push(priority, PendingJob(job, model, future))
        self._dispatch(index)
        return future

    def _model_ref(self, ray: ModuleType, key: ModelKey, weights: Weights) -> ObjectRef[Weights]:
        """The object-store copy of a model version, put there on first use.

        A fleet's versions two behind its newest are forgotten (as workers do); jobs still
        holding their reference keep the object alive.
        """
        ref = self._models.get(key)
        if ref is None:
            ref = ray.put(dict(weights))
            self._models[key] = ref
            for old in superseded(self._models, key):
                del self._models[old]
        return ref

    def _dispatch(self, index: int) -> None:
        actor = self._actors[index]
        for pending in self._queues[index].take():
            call = actor.run.remote(pending.job, pending.model).future()
            call.add_done_callback(partial(self._call_returned, index, pending))

    def _call_returned(
        self, index: int, pending: PendingJob, call: concurrent.futures.Future[JobResult]
    ) -> None:
        """In a Ray thread: hand the result to the event loop."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            loop.call_soon_threadsafe(self._complete, index, pending, call)

    def _complete(
        self, index: int, pending: PendingJob, call: concurrent.futures.Future[JobResult]
    ) -> None:
        """On the event loop: resolve the job's future and send the next job."""
        if index >= len(self._queues):
            return  # closed meanwhile
        self._queues[index].finished(pending)
        if not pending.future.done():
            pending.future.set_result(_result_of(call))
        self._dispatch(index)


def _result_of(call: concurrent.futures.Future[JobResult]) -> JobResult:
    """The job's result, or a failed one if the actor (not the user's code) broke."""
    try:
        return call.result()
    except Exception as exc:
        log.warning("Ray actor call failed: %s", _first_lines(exc))
        return JobResult("failed", f"simulation worker failed: {exc}"[:MAX_ERROR_CHARS])


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise BackendError(
            f"simulation.backend: ray needs Ray, which is not installed ({INSTALL_HINT})"
        ) from exc
    return ray


def _init_ray(ray: ModuleType, actors: int) -> bool:
    """Connect to Ray unless already connected; True if this call did.

    Without ``RAY_ADDRESS`` a private local instance is started (never an existing
    cluster found on this machine), with at least one CPU per actor.
    """
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS", "").strip()
    options: dict[str, Any] = {"log_to_driver": False, "ignore_reinit_error": True}
    if address:
        options["address"] = address
    else:
        cores = os.cpu_count() or 1
        options.update(address="local", num_cpus=max(actors, cores), include_dashboard=False)
    log.info("starting Ray (%s)", address or "local instance")
    try:
        _start_ray(ray, options, attempts=1 if address else LOCAL_START_ATTEMPTS)
    except Exception as exc:
        where = f"the Ray cluster at RAY_ADDRESS={address}" if address else "a local Ray"
        raise BackendError(f"could not start {where}: {_first_lines(exc)}") from exc
    return True


def _start_ray(ray: ModuleType, options: dict[str, Any], attempts: int) -> None:
    """``ray.init``, started again from scratch after each failure but the last."""
    for _ in range(attempts - 1):
        try:
            with _quiet_ray():
                ray.init(**options)
            return
        except Exception as exc:
            log.warning("Ray did not start (%s); starting it again", _first_lines(exc, 1))
            with _quiet_ray():
                ray.shutdown()  # what half started: the GCS and its helpers
    with _quiet_ray():
        ray.init(**options)


def _check_cpus(ray: ModuleType, actors: int) -> None:
    """Refuse actors Ray could never place (they would wait forever).

    The cluster's total, not what is free now: CPUs of actors just killed come back a
    moment later, and actors waiting for them start then.
    """
    cpus = float(ray.cluster_resources().get("CPU", 0.0))
    if cpus < actors:
        raise BackendError(
            f"the Ray cluster has {cpus:g} CPUs but simulation.workers asks for "
            f"{actors} actors (one CPU each); lower simulation.workers"
        )


@contextlib.contextmanager
def _quiet_ray() -> Iterator[None]:
    """Silence Ray's start-up and shut-down noise that users cannot act on.

    Ray leaves ``/dev/null`` handles and child ``Popen`` objects to the garbage collector
    (ResourceWarning) and prints a FutureWarning about GPU environment variables. The
    collection runs here, so those warnings do not surface later in unrelated code.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"ray\.")
        try:
            yield
        finally:
            gc.collect()


def _first_lines(exc: BaseException, lines: int = 3) -> str:
    text = str(exc).strip() or type(exc).__name__
    return "\n".join(text.splitlines()[:lines])[:MAX_ERROR_CHARS]
