"""Many connected nodes on one server while a real round runs (issue 14, load).

A ``geofl server`` process with node authentication (``server.auth``: an Ed25519 key per
node; ``--no-auth`` to compare) serves the quickstart run (scikit-learn digits, FedAvg) with
``schedule.selection.node_config: {pool: real}``, so rounds are trained by three real
``geofl client`` processes while a *crowd* of lightweight asyncio nodes stays connected:
each crowd node has its own gRPC channel (its own TCP connection), signs the server's
join challenge for that connection and joins, then keeps a long poll for work open and
sends a heartbeat every ``server.heartbeat_interval_s`` while no poll is open, as an idle
``geofl client`` does. The crowd runs in ``--crowd-processes`` processes of this module
(``--crowd-child``).

Per case (crowd size 0, then each ``--crowds`` size): the crowd's join time and joins per
second, the server's peak RSS and CPU share while the real rounds run (psutil), how many
crowd nodes had their last call answered (fewest over the real rounds), how many the
server took for gone (its "went offline" log lines), the crowd's failed calls and
re-joins (a crowd node joins again when the server no longer knows its session), and the
seconds per real round read from the run's database. The real rounds' times (rounds 2..R: round 1
includes the real clients' start-up) are compared with the case without a crowd.

Run as ``python -m benchmarks.load --crowds 1000,5000 --rounds 3``; prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from benchmarks.core import REPO_ROOT, free_port, stop_tree, stop_trees, wait_for_port
from geofl.client.runtime import ClientOptions
from geofl.protocols import identity
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.protocols.v1 import geofl_pb2_grpc as pb_grpc
from geofl.server.transport.servicer import SESSION_METADATA_KEY
from geofl.storage import open_database, queries

__all__ = ["main", "run_case"]

HEARTBEAT_S = 5.0
#: The long poll of an idle geofl client (its default).
POLL_S = ClientOptions(server="-").poll_timeout_s
JOIN_ATTEMPTS = 5
REAL_CLIENTS = 3
#: Each crowd node gets its own TCP connection, as separate machines would: without a
#: local subchannel pool, gRPC shares one connection among every channel of a process
#: to the same address (its global subchannel pool), and a crowd process's nodes would
#: all be streams of one HTTP/2 connection.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def run_yaml(port: int, rounds: int, workdir: Path, auth: bool) -> dict[str, Any]:
    """The quickstart run, trained by the ``pool: real`` nodes only."""
    server: dict[str, Any] = {"address": f"127.0.0.1:{port}", "heartbeat_interval_s": HEARTBEAT_S}
    if auth:
        server["auth"] = {"nodes": str(workdir / "nodes")}
    return {
        "run": {"name": "load", "rounds": rounds, "seed": 7},
        "model": "examples.quickstart.task:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": REAL_CLIENTS, "min_clients": 3},
        "round_config": {"local_epochs": 1, "lr": 0.05, "batch_size": 32},
        "evaluation": {"every": 1, "server": "examples.quickstart.task:server_evaluate"},
        "schedule": {
            "wait_for_clients_s": 600,
            "deadline_s": 120,
            "selection": {"node_config": {"pool": "real"}},
        },
        "storage": {
            "url": f"sqlite:///{workdir / 'load.db'}",
            "checkpoints": str(workdir / "ckpt"),
        },
        "server": server,
    }


def write_keys(workdir: Path, names: Sequence[str]) -> None:
    """An Ed25519 key per node: private keys under keys/, the authorized list under nodes/."""
    (workdir / "keys").mkdir()
    (workdir / "nodes").mkdir()
    entries = []
    for name in names:
        key = identity.generate_key()
        (workdir / "keys" / f"{name}.key").write_bytes(identity.private_pem(key))
        entries.append({"name": name, "public_key": identity.public_pem(key.public_key())})
    (workdir / "nodes" / "nodes.yaml").write_text(yaml.safe_dump({"nodes": entries}))


# ------------------------------------------------------------------- the crowd


async def _prove(stub: Any, request: pb.JoinRequest, key: Ed25519PrivateKey) -> None:
    """Sign the server's challenge for this connection, as ``geofl client --node-key`` does."""
    challenge = await stub.Challenge(pb.ChallengeRequest(), timeout=120)
    message = identity.join_message(
        challenge.run_id, challenge.run_name, challenge.nonce, challenge.channel, request.node_name
    )
    request.proof.public_key = identity.raw_public_key(key.public_key())
    request.proof.nonce = challenge.nonce
    request.proof.signature = key.sign(message)


async def _join(
    stub: Any, name: str, key: Ed25519PrivateKey | None, failures: Counter[str]
) -> pb.JoinReply | None:
    """Join as geofl client does, retrying a failed join; ``None`` if every attempt failed."""
    for _ in range(JOIN_ATTEMPTS):
        request = pb.JoinRequest(protocol_versions=[1], node_name=name)
        request.node_config["pool"].string = "crowd"
        try:
            if key is not None:
                await _prove(stub, request, key)
            reply: pb.JoinReply = await stub.Join(request, timeout=120)
            return reply
        except grpc.aio.AioRpcError as error:
            failures[f"{error.code().name}: {error.details()}"[:160]] += 1
    return None


async def _crowd_node(
    port: int,
    name: str,
    key: Ed25519PrivateKey | None,
    joined: asyncio.Queue[float | None],
    stop: asyncio.Event,
    healthy: set[str],
    failures: Counter[str],
) -> None:
    """One idle node; in ``healthy`` while its last call was answered.

    Like geofl client, it joins again when the server no longer knows its session
    (``UNAUTHENTICATED``); ``failures["rejoins"]`` counts those joins.
    """
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
        t0 = time.perf_counter()
        reply = await _join(stub, name, key, failures)
        await joined.put(time.perf_counter() - t0 if reply is not None else None)
        while reply is not None and not stop.is_set():
            healthy.add(name)
            if await _idle_session(stub, name, reply.session_token, stop, healthy, failures):
                return  # the run is over
            failures["rejoins"] += 1
            reply = await _join(stub, name, key, failures)


async def _idle_session(
    stub: Any,
    name: str,
    token: str,
    stop: asyncio.Event,
    healthy: set[str],
    failures: Counter[str],
) -> bool:
    """Poll and heartbeat until SHUTDOWN or ``stop`` (``True``) or the session is lost."""
    metadata = ((SESSION_METADATA_KEY, token),)
    polling = asyncio.Event()

    async def beat() -> None:  # as geofl client: only while no long poll is open
        while not stop.is_set():
            await asyncio.sleep(HEARTBEAT_S)
            if polling.is_set():
                continue
            try:
                await stub.Heartbeat(pb.HeartbeatRequest(), metadata=metadata, timeout=60)
                healthy.add(name)
            except grpc.aio.AioRpcError as error:
                healthy.discard(name)
                failures[f"Heartbeat {error.code().name}: {error.details()}"[:160]] += 1

    async def poll() -> bool:  # until the server says the run is over or forgets us
        while True:
            polling.set()
            try:
                task = await stub.GetTask(
                    pb.GetTaskRequest(poll_timeout_s=POLL_S),
                    metadata=metadata,
                    timeout=POLL_S + 10.0,
                )
                healthy.add(name)
                if task.kind == pb.TASK_KIND_SHUTDOWN:
                    return True
            except grpc.aio.AioRpcError as error:
                healthy.discard(name)
                failures[f"GetTask {error.code().name}: {error.details()}"[:160]] += 1
                if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                    return False
                await asyncio.sleep(1.0)
            finally:
                polling.clear()

    polls = asyncio.create_task(poll())
    stopped = asyncio.create_task(stop.wait())
    beats = asyncio.create_task(beat())
    await asyncio.wait({polls, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (polls, stopped, beats):
        task.cancel()
    return stop.is_set() or (polls.done() and not polls.cancelled() and polls.result())


async def _crowd(port: int, names: Sequence[str], keys: Path | None, status: Path) -> None:
    joined: asyncio.Queue[float | None] = asyncio.Queue()
    stop = asyncio.Event()
    healthy: set[str] = set()
    failures: Counter[str] = Counter()
    nodes = len(names)
    signers = {
        n: identity.load_private_key(keys / f"{n}.key") if keys is not None else None for n in names
    }
    started = time.perf_counter()
    workers = [
        asyncio.create_task(_crowd_node(port, n, signers[n], joined, stop, healthy, failures))
        for n in names
    ]
    outcomes = [await joined.get() for _ in range(nodes)]
    join_s = [s for s in outcomes if s is not None]
    report: dict[str, Any] = {"joined": len(join_s), "join_wall_s": time.perf_counter() - started}
    report["join_s"] = join_s
    report["join_failures"] = dict(failures)
    stop_file = status.with_suffix(".stop")
    while not stop_file.exists():
        report["healthy"] = len(healthy)
        report["failures"] = dict(failures)  # joins', then polls' and heartbeats'
        _write_atomically(status, json.dumps(report))
        await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.replace(path)


# ------------------------------------------------------------------- one case


def _python_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{path}" if path else str(REPO_ROOT),
    }


def _wait_for(paths: Sequence[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and p.stat().st_size > 0 for p in paths):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the crowd did not join within {timeout_s:.0f} s")
        time.sleep(0.2)


def crowd_names(crowd: int) -> list[str]:
    return [f"crowd-{i}" for i in range(crowd)]


#: ``--split-cpus``: the server and the real clients on these CPUs, the crowd on the rest.
SERVER_CPUS = frozenset({0})


def _pinned(cpus: frozenset[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` that pins the child (and every thread it starts) to ``cpus``."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def _crowd_cpus() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0)) - SERVER_CPUS


def _start_crowd(
    port: int,
    crowd: int,
    processes: int,
    workdir: Path,
    auth: bool,
    cpus: frozenset[int] | None = None,
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    children = []
    names = crowd_names(crowd)
    for index in range(processes):
        status = workdir / f"crowd-{index}.json"
        names_file = workdir / f"crowd-{index}.names"
        names_file.write_text("\n".join(names[index::processes]))
        command = [sys.executable, "-m", "benchmarks.load", "--crowd-child", str(names_file)]
        command += ["--port", str(port), "--status", str(status)]
        if auth:
            command += ["--keys", str(workdir / "keys")]
        child = subprocess.Popen(
            command, env=_python_env(), cwd=REPO_ROOT, preexec_fn=_pinned(cpus)
        )
        children.append((child, status))
    return children


def _round_seconds(db_url: str) -> list[float]:
    with open_database(db_url, migrate=False) as db, db.session() as session:
        run_id = queries.list_runs(session)[0].id
        detail = queries.run_detail(session, run_id)
    return [r.duration_s for r in detail.rounds if r.duration_s is not None]


def run_case(
    crowd: int, rounds: int, crowd_processes: int, auth: bool, split_cpus: bool = False
) -> dict[str, Any]:
    """One server, ``crowd`` idle nodes, the real rounds; the case's figures.

    ``split_cpus``: the server and the real clients run on :data:`SERVER_CPUS` and the
    crowd on the other CPUs, so the crowd's own work does not slow the real round (the
    crowd stands for nodes on other machines).
    """
    server_cpus = SERVER_CPUS if split_cpus else None
    crowd_cpus = _crowd_cpus() if split_cpus else None
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch)
        port = free_port()
        if auth:
            write_keys(workdir, [*crowd_names(crowd), *(f"real-{i}" for i in range(REAL_CLIENTS))])
        config = workdir / "run.yaml"
        config.write_text(yaml.safe_dump(run_yaml(port, rounds, workdir, auth)))
        server_log = workdir / "server.log"
        with server_log.open("wb") as log_file:
            server = subprocess.Popen(
                [sys.executable, "-m", "geofl.server.cli.main", "server", "-v", "-c", str(config)],
                env=_python_env(),
                cwd=REPO_ROOT,
                preexec_fn=_pinned(server_cpus),
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        children: list[tuple[subprocess.Popen[bytes], Path]] = []
        clients: list[subprocess.Popen[bytes]] = []
        try:
            wait_for_port(port, 60)
            proc = psutil.Process(server.pid)
            crowd_report: dict[str, Any] = {}
            if crowd:
                children = _start_crowd(port, crowd, crowd_processes, workdir, auth, crowd_cpus)
                _wait_for([s for _, s in children], timeout_s=600)
                crowd_report = _joins([json.loads(s.read_text()) for _, s in children])
            idle_rss = proc.memory_info().rss
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            for i in range(REAL_CLIENTS):
                command = [sys.executable, "-m", "geofl.client", "--server", f"127.0.0.1:{port}"]
                command += ["--app", "examples.quickstart.task:client_app", "--name", f"real-{i}"]
                command += ["--node-config", "pool=real", f"partition-id={i}"]
                command += [f"num-partitions={REAL_CLIENTS}"]
                if auth:
                    command += ["--node-key", str(workdir / "keys" / f"real-{i}.key")]
                real = subprocess.Popen(
                    command, env=_python_env(), cwd=REPO_ROOT, preexec_fn=_pinned(server_cpus)
                )
                clients.append(real)
            db_path = workdir / "load.db"
            statuses = [s for _, s in children]
            watch = _watch(proc, server, statuses, lambda: _rounds_ended(db_path) < rounds)
            for _, status in children:
                status.with_suffix(".stop").write_text("")
            for child, _ in children:
                child.wait(120)
            return {
                "crowd": crowd,
                "authenticated": auth,
                "server_exit": server.returncode,
                "round_s": _round_seconds(f"sqlite:///{db_path}"),
                "server_rss_idle_mb": idle_rss / 2**20,
                "server_rss_peak_mb": watch.peak_rss / 2**20,
                "server_cpu_share": (watch.cpu_s - cpu0) / (watch.at - t0),
                "crowd_healthy_min": watch.healthy_min,
                "crowd_taken_offline": _offline_crowd_nodes(server_log),
                "crowd_call_failures": dict(watch.failures),
                "split_cpus": split_cpus,
                **crowd_report,
            }
        finally:
            stop_trees([c.pid for c in clients] + [c.pid for c, _ in children])
            stop_tree(server.pid)
            for process in [*clients, *(c for c, _ in children), server]:
                process.wait(30)


def _offline_crowd_nodes(server_log: Path) -> int:
    """Crowd nodes the server marked offline (``geofl server -v`` logs each one)."""
    lines = server_log.read_text(errors="replace").splitlines()
    return sum(1 for line in lines if "went offline" in line and "(crowd-" in line)


def _joins(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    join_s = [s for r in reports for s in r["join_s"]]
    wall = max(r["join_wall_s"] for r in reports)
    failures: Counter[str] = Counter()
    for report in reports:
        failures.update(report["join_failures"])
    return {
        "joined": sum(r["joined"] for r in reports),
        "join_failures": dict(failures),
        "join_ms_median": 1000 * statistics.median(join_s),
        "joins_per_s": len(join_s) / wall,
    }


def _rounds_ended(db_path: Path) -> int:
    """Rounds of the run that ended (committed or failed) so far; 0 before the database."""
    if not db_path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)) as db:
        try:
            row = db.execute("SELECT count(*) FROM rounds WHERE status != 'running'").fetchone()
        except sqlite3.OperationalError:  # tables not created yet, or locked a moment
            return 0
    return int(row[0])


@dataclass
class _Watch:
    peak_rss: int = 0
    cpu_s: float = 0.0
    at: float = 0.0
    #: The fewest crowd nodes whose last call was answered, over the real rounds (None: no crowd).
    healthy_min: int | None = None
    #: The crowd's failed calls until the last real round ended (not the server's exit).
    failures: Counter[str] = field(default_factory=Counter)


def _watch(
    proc: psutil.Process,
    server: subprocess.Popen[bytes],
    statuses: Sequence[Path],
    in_rounds: Callable[[], bool],
    timeout_s: float = 900,
) -> _Watch:
    """Sample the server's RSS and CPU time until it exits, and the crowd's health and
    failed calls while ``in_rounds()`` (the real rounds have not all ended)."""
    deadline = time.monotonic() + timeout_s
    watch = _Watch()
    while server.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the real rounds did not finish")
        try:
            watch.peak_rss = max(watch.peak_rss, proc.memory_info().rss)
            watch.cpu_s, watch.at = sum(proc.cpu_times()[:2]), time.monotonic()
        except psutil.NoSuchProcess:
            break
        if statuses and in_rounds():
            reports = [json.loads(s.read_text()) for s in statuses]
            healthy = sum(r["healthy"] for r in reports)
            watch.healthy_min = min(healthy, watch.healthy_min or healthy)
            watch.failures = Counter()
            for report in reports:
                watch.failures.update(report["failures"])
        time.sleep(0.5)
    return watch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crowds", default="1000,5000", help="crowd sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=4, help="at least 2")
    parser.add_argument("--crowd-processes", type=int, default=4)
    parser.add_argument(
        "--no-auth", action="store_true", help="nodes join unauthenticated (default: Ed25519 keys)"
    )
    parser.add_argument(
        "--split-cpus",
        action="store_true",
        help="server and real clients on CPU 0, the crowd on the other CPUs (both cases)",
    )
    parser.add_argument("--crowd-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keys", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--status", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.crowd_child is not None:
        names = args.crowd_child.read_text().split()
        asyncio.run(_crowd(args.port, names, args.keys, args.status))
        return 0
    auth = not args.no_auth
    if args.split_cpus and not _crowd_cpus():
        parser.error("--split-cpus needs at least two CPUs")
    cases = [run_case(0, args.rounds, args.crowd_processes, auth, args.split_cpus)]
    for size in (int(s) for s in args.crowds.split(",") if s):
        cases.append(run_case(size, args.rounds, args.crowd_processes, auth, args.split_cpus))
        print(json.dumps(cases[-1]), file=sys.stderr)
    # Round 1 includes the real clients' start-up and joining: compare rounds 2..R.
    alone = statistics.median(cases[0]["round_s"][1:])
    for case in cases:
        case["round_s_median"] = statistics.median(case["round_s"][1:])
        case["round_vs_alone"] = case["round_s_median"] / alone
    print(json.dumps({"cases": cases, "load_average": os.getloadavg()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
