"""How a wall-clock simulation runs its clients: a few worker processes, or one each.

By default (``simulation.pooled``) the clients are spread over ``simulation.workers``
long-lived ``python -m geofl.client.pool`` processes (one per CPU core unless set), each
running many clients, each client with its own gRPC connection and state
(:mod:`geofl.client.pool`). With ``pooled: false`` every client is its own ``geofl
client`` process, as a deployment would run it.

Either way each process gets at most ``simulation.client_threads`` math-library threads
(OpenMP, MKL, OpenBLAS; torch's intra-op pool follows ``OMP_NUM_THREADS``), set in its
environment so they apply before torch or NumPy initialise: simulated clients share the
machine's cores, and a torch default of one thread per core in every process
oversubscribes them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from geofl.protocols.types import Scalar
from geofl.server.simulation.commands import pool_command, simulated_client_command
from geofl.server.simulation.processes import ProcessGroup

__all__ = [
    "THREAD_VARIABLES",
    "ClientLaunch",
    "ClientTarget",
    "cpu_cores",
    "start_clients",
    "thread_env",
    "worker_count",
    "worker_members",
    "worker_name",
]

#: Environment variables that cap the math libraries' thread pools.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class ClientTarget:
    """Where simulated client ``index`` connects (a port on 127.0.0.1) and its region."""

    index: int
    port: int
    region: str | None = None


@dataclass(frozen=True)
class ClientLaunch:
    """What every simulated client runs, and in which processes."""

    app: str
    clients: int
    node_config: Mapping[str, Scalar] = field(default_factory=dict)
    #: Math-library threads per process; 0 leaves the libraries' defaults.
    threads: int = 1
    #: Worker processes when pooled; None = one per CPU core (at most one per client).
    workers: int | None = None
    pooled: bool = True
    #: The processes' environment (None: this process's), before the thread cap.
    env: Mapping[str, str] | None = None


def cpu_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def worker_count(chosen: int | None, clients: int) -> int:
    """``chosen`` worker processes, or one per CPU core; never more than ``clients``."""
    wanted = cpu_cores() if chosen is None else chosen
    return max(1, min(wanted, clients))


def worker_members(targets: Sequence[ClientTarget], workers: int) -> list[list[ClientTarget]]:
    """The clients of each worker: client ``i`` goes to worker ``i % workers``."""
    groups: list[list[ClientTarget]] = [[] for _ in range(workers)]
    for position, target in enumerate(targets):
        groups[position % workers].append(target)
    return [group for group in groups if group]


def thread_env(threads: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the thread cap, if any."""
    env = dict(os.environ if base is None else base)
    if threads > 0:
        env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    return env


def start_clients(
    group: ProcessGroup, launch: ClientLaunch, targets: Sequence[ClientTarget]
) -> None:
    """Start the processes of the simulated ``targets`` (all of ``launch.clients``) in ``group``.

    Pooled, each worker is named after its clients (:func:`worker_name`) in messages.
    """
    env = thread_env(launch.threads, launch.env)
    node_config = dict(launch.node_config)
    if not launch.pooled:
        for target in targets:
            command = simulated_client_command(
                launch.app, target.port, target.index, launch.clients, node_config, target.region
            )
            group.start(f"client {target.index}", command, env)
        return
    for members in worker_members(targets, worker_count(launch.workers, len(targets))):
        command = pool_command(
            launch.app,
            [(m.index, m.port, m.region) for m in members],
            launch.clients,
            node_config,
        )
        group.start(worker_name([m.index for m in members]), command, env)


def worker_name(indices: Sequence[int], shown: int = 6) -> str:
    """A worker as messages name it: ``"clients 0,2,4"``, or ``"clients 0,2,...,98 (50)"``."""
    if len(indices) <= shown:
        return "clients " + ",".join(str(i) for i in indices)
    head = ",".join(str(i) for i in indices[: shown - 1])
    return f"clients {head},...,{indices[-1]} ({len(indices)})"
