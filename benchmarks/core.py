"""What every benchmarked system shares: the workload, the run context, the results.

A :class:`System` (Flower, geofl) knows only how to deploy itself for a
:class:`Workload` on loopback and how to read back its per-round times. Everything
measured the same way for every system lives in the harness: the byte-counting proxy in
front of the server, the memory sampler over the process trees, machine load, cleanup.
The :class:`RunContext` is the seam between the two: a system starts its processes through
:meth:`RunContext.spawn`, naming the group (``"server"`` or ``"site-<i>"``) each belongs to.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import psutil

from benchmarks.procmon import ProcessMonitor

__all__ = [
    "HEAVY_LOCK",
    "REPO_ROOT",
    "SERVER_GROUP",
    "TASKS",
    "BenchmarkError",
    "MemoryRole",
    "RoundRecord",
    "RunContext",
    "System",
    "SystemRun",
    "Workload",
    "console_script",
    "free_port",
    "heavy_lock",
    "stop_tree",
    "stop_trees",
    "wait_for_port",
]

SERVER_GROUP = "server"
#: Repository root; put it on PYTHONPATH for processes that load ``benchmarks.apps...``
#: (spawned processes run in the temporary work directory).
REPO_ROOT = Path(__file__).resolve().parents[1]
#: The shared host's lock for CPU-heavy work, the file that ``flock(1)`` users take too.
HEAVY_LOCK = Path(tempfile.gettempdir()) / "geofl-heavy.lock"


@contextmanager
def heavy_lock() -> Iterator[None]:
    """Hold :data:`HEAVY_LOCK` (the same flock(2) lock as ``flock(1)``).

    Not re-entrant across processes: a program started under ``flock(1)`` on this file
    must not take it again (it would wait for its own parent).
    """
    with HEAVY_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: What clients do in a round. ``echo``: return the model plus ``1 + partition-id``, no
#: training (framework cost only). ``mlp-digits``: train the MLP of
#: :mod:`benchmarks.apps.digits_mlp` (a real task with an accuracy). ``cnn-fashion``: train
#: the CNN of :mod:`benchmarks.apps.fashion_cnn` on Fashion-MNIST (heavier, torch threads
#: left to the framework).
TASKS = ("echo", "mlp-digits", "cnn-fashion")


class BenchmarkError(RuntimeError):
    """A deployment failed: a process exited early, a timeout passed, a result is wrong."""


@dataclass(frozen=True)
class Workload:
    """One benchmark case.

    Attributes
    ----------
    params
        Model size in float32 parameters: the ``echo`` model's size (one tensor named
        ``w``); for ``mlp-digits`` the MLP's size, which the task fixes (informational).
    clients
        Number of client processes (sites); every client takes part in every round.
    rounds
        Training rounds.
    timeout_s
        Wall-clock limit for the whole deployment, start-up included.
    task
        One of :data:`TASKS`.
    """

    params: int
    clients: int
    rounds: int
    timeout_s: float = 900.0
    task: str = "echo"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; expected one of {TASKS}")

    @property
    def model_bytes(self) -> int:
        """Raw payload of one model copy."""
        return 4 * self.params

    def expected_shift(self) -> float | None:
        """Mean of (final model - initial model) under FedAvg with equal weights.

        Each ``echo`` round adds the mean client constant, ``1 + (clients - 1) / 2``; a system
        whose final model moved by another amount lost or duplicated updates. None for a
        training task, whose result is checked by its accuracy instead.
        """
        if self.task != "echo":
            return None
        return self.rounds * (1.0 + (self.clients - 1) / 2.0)


@dataclass(frozen=True)
class RoundRecord:
    """One round as the system itself reports it.

    ``start_wall`` (Unix time) lets the harness attribute proxy bytes to the round;
    ``bytes_up``/``bytes_down`` are the system's own accounting when it has one.
    """

    number: int
    duration_s: float
    start_wall: float | None = None
    bytes_up: int | None = None
    bytes_down: int | None = None


@dataclass
class SystemRun:
    """What a system returns after a completed deployment."""

    rounds: list[RoundRecord]
    final_shift: float | None = None
    accuracy: float | None = None
    system_bytes: dict[str, int] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


@dataclass
class RunContext:
    """Where and how a system deploys itself for one measured run.

    Attributes
    ----------
    workdir
        A fresh directory for configs, logs and databases of this run.
    server_port
        The port the server must listen on (127.0.0.1).
    client_port
        The port clients must connect to: the byte-counting proxy in front of the server.
    monitor
        Memory sampler; :meth:`spawn` registers each process with it.
    """

    workdir: Path
    server_port: int
    client_port: int
    monitor: ProcessMonitor
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(
        self, group: str, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start a process in its own session, logging to ``workdir/logs/<name>.log``.

        ``group`` is ``"server"`` or ``"site-<i>"``: the memory peak is summed per group.
        """
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        full_env = {**os.environ, **(env or {})}
        with (logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=self.workdir,
                start_new_session=True,
            )
        self.procs.append(proc)
        self.monitor.add(group, proc.pid)
        return proc

    def check_alive(self) -> None:
        """Fail fast, naming the log, if a long-lived process died."""
        if self.monitor.exceeded:
            raise BenchmarkError(f"memory brake: {self.monitor.exceeded}")
        for proc in self.procs:
            code = proc.poll()
            if code is not None and code != 0:
                raise BenchmarkError(
                    f"process {proc.args!r} exited with code {code}; see {self.workdir / 'logs'}"
                )

    def stop_all(self) -> None:
        """Stop every process started through :meth:`spawn` and all their descendants."""
        stop_trees([proc.pid for proc in self.procs])
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _alive(proc: psutil.Process) -> bool:
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def stop_trees(pids: Sequence[int], grace_s: float = 5.0) -> None:
    """SIGTERM each PID and its descendants (by PID), SIGKILL what survives ``grace_s``.

    All trees are signalled first and waited for together, and zombies (exited children
    that a framework process has not reaped yet) count as stopped.
    """
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs += [*root.children(recursive=True), root]
        except psutil.Error:
            continue
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            continue
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        time.sleep(0.1)
    for proc in procs:
        if _alive(proc):
            try:
                proc.kill()
            except psutil.Error:
                continue


def stop_tree(pid: int, grace_s: float = 5.0) -> None:
    """Stop one process tree (see :func:`stop_trees`)."""
    stop_trees([pid], grace_s)


def wait_for_port(port: int, timeout_s: float, ctx: RunContext | None = None) -> None:
    """Block until 127.0.0.1:``port`` accepts TCP connections."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ctx is not None:
            ctx.check_alive()
        with socket.socket() as sock:
            sock.settimeout(0.5)
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise BenchmarkError(f"nothing listened on 127.0.0.1:{port} within {timeout_s:.0f} s")


def console_script(name: str) -> str:
    """A console script of the running interpreter's environment (the venv's Flower, geofl)."""
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise BenchmarkError(f"{name!r} not found next to {sys.executable} or on PATH")
    return found


def free_port() -> int:
    """A currently free loopback port (racy by nature; fine on a benchmark host)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class MemoryRole:
    """Processes that together play one role (the server, one client), named by kind.

    For systems whose roles are not separate process trees (a simulation: the clients are
    children of the server process, or Ray actors). ``kinds`` are
    :func:`benchmarks.procmon.classify_cmdline` names. ``per_process=False``: the peak over
    time of the summed RSS of all processes of these kinds; ``True``: the peak of the
    largest single such process ("one client" when each client is a process).
    """

    kinds: frozenset[str]
    per_process: bool = False


class System(ABC):
    """A federated-learning framework deployed as real processes on loopback."""

    #: Short name used on the command line and in results (``"flower"``, ``"geofl"``).
    name: str = ""
    #: Whether clients reach the server through the harness's byte-counting proxy. A
    #: simulation has no such hop; its bytes are the system's own accounting.
    wire_proxy: ClassVar[bool] = True
    #: Role -> processes, for systems whose server and client sites are not separate
    #: ``spawn`` groups; the harness then reports ``peak_rss_roles_mb`` per role.
    memory_roles: ClassVar[Mapping[str, MemoryRole]] = {}

    @abstractmethod
    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        """Deploy server and ``workload.clients`` clients, run to completion, report rounds.

        Start every process with ``ctx.spawn`` (group ``"server"`` or ``"site-<i>"``); the
        server listens on ``ctx.server_port`` and clients dial ``ctx.client_port``. Return
        only after the run finished; raise :class:`BenchmarkError` on any failure. The
        harness stops the processes afterwards.
        """
