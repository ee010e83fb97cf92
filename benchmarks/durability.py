"""SIGKILL at each phase of a round: updates lost and seconds from restart to the commit.

For each phase (``broadcast``, ``fit`` with half the updates accepted, ``aggregate``,
``commit``) a fresh run starts ``geofl server`` and four ``geofl client`` processes of the
test app (two answer at once, two sleep ``--slow-s`` in fit, so half the updates are in
when the slow ones are still training). The driver polls the run's SQLite database and
SIGKILLs the server as soon as round 1 is in the phase, then restarts it and times how
long the restarted server takes to commit round 1.

"Updates lost" counts updates the server had acknowledged (staged) at the kill whose
client had to train round 1 again after the restart (read from each client's count
file); the target is 0. The phase the kill actually landed in is read back from the
database, so a phase too short to hit by polling shows as the phase that was hit.

Run as ``python -m benchmarks.durability --model geofl_testapp:make_large_model``;
prints one JSON object per phase. ``--stage-cost N`` instead times what staging adds to
one accepted upload of N float32 values before its ack (:meth:`DurableUploads.stage`:
the safetensors file with fsync and rename, and the database row), on SQLite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from geofl.server.models.staging import DurableUploads
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage import open_database, queries

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
from processes import free_port, start_client, start_geofl, write_config

__all__ = ["PHASES", "kill_at", "main", "phase_reached", "stage_cost"]

PHASES = ("broadcast", "fit", "aggregate", "commit")


def _state(db_url: str) -> tuple[str | None, int, int]:
    """Round 1's phase, its staged updates, and the run's last committed round."""
    try:
        with open_database(db_url, migrate=False, retry_s=0) as db, db.session() as session:
            runs = queries.list_runs(session)
            if not runs:
                return None, 0, 0
            detail = queries.run_detail(session, runs[0].id)
            phase = next((r.phase for r in detail.rounds if r.number == 1), None)
            staged = len(queries.staged_updates(session, runs[0].id, 1))
            return phase, staged, runs[0].last_committed_round
    except Exception:  # not created yet, or locked by the server for a moment
        return None, 0, 0


def phase_reached(phase: str, state: tuple[str | None, int, int]) -> bool:
    current, staged, committed = state
    if committed >= 1:
        return True  # too late: report what was hit
    if phase == "fit":
        return staged >= 2
    return current == phase


def _client(work: Path, port: int, index: int, slow_s: float) -> subprocess.Popen[str]:
    behaviour = "ok" if index < 2 else "slow"
    node_config = f"behaviour={behaviour} delay_s={slow_s} count-dir={work}"
    return start_client(work, port, index, node_config, reconnect_for_s=120)


def _trained_round_1(work: Path, index: int) -> int:
    path = work / f"{index}.log"
    return [int(x) for x in path.read_text().split()].count(1) if path.exists() else 0


def kill_at(phase: str, model: str, slow_s: float, work: Path) -> dict[str, Any]:
    """One run killed at ``phase`` of round 1 and restarted; what survived and how fast."""
    port = free_port()
    config = write_config(
        work,
        run={"rounds": 1},
        model=model,
        evaluation={"every": 0},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 4},
        schedule={"deadline_s": 120, "wait_for_clients_s": 120},
        server={"address": f"127.0.0.1:{port}", "heartbeat_interval_s": 0.5},
    )
    db_url = f"sqlite:///{work / 'runs' / 'geofl.db'}"
    server = start_geofl(work, "server", "-c", str(config))
    clients = [_client(work, port, i, slow_s) for i in range(4)]
    processes = [server, *clients]
    try:
        deadline = time.monotonic() + 120
        while not phase_reached(phase, _state(db_url)):
            if server.poll() is not None:  # finished between two polls: nothing to kill
                return {"phase_wanted": phase, "phase_hit": "run finished before the kill"}
            if time.monotonic() > deadline:
                raise RuntimeError(f"round 1 never reached {phase}")
            time.sleep(0.001)
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=10)
        hit, staged, committed = _state(db_url)
        staged_nodes = staged
        restarted_at = time.monotonic()
        restarted = start_geofl(work, "server", "-c", str(config))
        processes.append(restarted)
        while _state(db_url)[2] < 1:
            if restarted.poll() is not None or time.monotonic() - restarted_at > 300:
                raise RuntimeError("the restarted server did not commit round 1")
            time.sleep(0.02)
        to_commit = time.monotonic() - restarted_at
        restarted.communicate(timeout=60)
        # A client still backing off when a quick restart ends the run misses its
        # shutdown and retries until --reconnect-for: it is stopped here instead.
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    fast_retrained = sum(1 for i in range(2) if _trained_round_1(work, i) > 1)
    return {
        "phase_wanted": phase,
        "phase_hit": "committed" if committed else hit,
        "updates_staged_at_kill": staged_nodes,
        # Staged updates are those of the fast sites (the slow ones were still training).
        "updates_lost": fast_retrained if staged_nodes else 0,
        "restart_to_commit_s": round(to_commit, 2),
        "trained_round_1": [_trained_round_1(work, i) for i in range(4)],
    }


def stage_cost(params: int, repeats: int, work: Path) -> dict[str, Any]:
    """Median seconds :meth:`DurableUploads.stage` takes for one update of ``params`` floats."""
    db = open_database(f"sqlite:///{work / 'geofl.db'}")
    with db.session() as session:
        run = queries.create_run(session, "stage-cost", {}, 1)
        node = queries.upsert_node(session, run.id, "site", None, {})
    uploads = DurableUploads(db, work / "checkpoints", run.id)
    rng = np.random.default_rng(0)

    async def once(index: int) -> float:
        update = {"w": rng.standard_normal(params, dtype=np.float32)}
        loop = asyncio.get_running_loop()
        task = TaskRecord(index, node.id, "fit", 1, 0, {}, 0.0, loop.create_future())
        outcome = Outcome("ok", num_examples=10, payload=DeltaUpdate(update))
        started = time.perf_counter()
        await uploads.stage(task, outcome)
        return time.perf_counter() - started

    async def every() -> list[float]:
        return [await once(i) for i in range(repeats)]

    times = asyncio.run(every())
    db.close()
    return {
        "params": params,
        "bytes": params * 4,
        "repeats": repeats,
        "stage_median_s": round(statistics.median(times), 4),
        "stage_max_s": round(max(times), 4),
    }


def main(argv: list[str] | None = None) -> None:
    """Run every phase once; print a JSON line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="geofl_testapp:make_model")
    parser.add_argument("--slow-s", type=float, default=6.0)
    parser.add_argument("--phases", nargs="*", default=list(PHASES))
    parser.add_argument("--stage-cost", type=int, default=0, metavar="PARAMS")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.stage_cost:
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(stage_cost(args.stage_cost, args.repeats, Path(work))))
        return
    for phase in args.phases:
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(kill_at(phase, args.model, args.slow_s, Path(work))), flush=True)


if __name__ == "__main__":
    main()
