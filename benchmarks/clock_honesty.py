"""How honest is the virtual clock? The same WAN run on the wall clock and on the virtual one.

The wall-clock run is ``geofl simulate`` with real client processes over real gRPC, each
client's link emulated by geofl's user-space shaper; the virtual run is the same YAML with
``simulation.clock: virtual``. Both record per-round and per-client durations in their
databases; this script reads them back and compares medians.

Workload (issue 3): three regions (20/80/220 ms RTT, 50/20/5 Mbit/s up, 100/50/20 down),
12 clients all selected every round, a 5 M-parameter float32 model (20 MB each way),
clients that echo the model plus a constant (no training: ``benchmarks.apps.geofl_echo``),
so the round time is the network's.

    python -m benchmarks.clock_honesty --rounds 4 --out benchmarks/results/clock_honesty.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select

from geofl.storage import open_database
from geofl.storage.models import Node, Participation, Round

__all__ = ["compare", "main", "run_config"]

REGIONS = {
    "near": {"share": 0.25, "rtt_ms": 20, "up_mbps": 50, "down_mbps": 100},
    "mid": {"share": 0.25, "rtt_ms": 80, "up_mbps": 20, "down_mbps": 50},
    "far": {"share": 0.5, "rtt_ms": 220, "up_mbps": 5, "down_mbps": 20},
}
PARAMS = 5_000_000
CLIENTS = 12
LOCK = "/tmp/geofl-heavy.lock"


def run_config(clock: str, rounds: int, workdir: Path) -> dict[str, Any]:
    """The run both clocks execute; only ``simulation.clock`` differs."""
    return {
        "run": {"name": f"honesty-{clock}", "rounds": rounds, "seed": 3},
        "model": "benchmarks.apps.geofl_echo:make_model",
        "strategy": {"name": "fedavg", "clients_per_round": CLIENTS, "min_clients": CLIENTS},
        "schedule": {"deadline_s": 600, "wait_for_clients_s": 120},
        "evaluation": {"every": 0},
        "storage": {
            "url": f"sqlite:///{workdir / 'run.db'}",
            "checkpoints": str(workdir / "ckpt"),
            "keep_checkpoints": 1,
        },
        "server": {"address": "127.0.0.1:0", "max_model_bytes": 64 << 20},
        "simulation": {
            "clients": CLIENTS,
            "app": "benchmarks.apps.geofl_echo:client_app",
            "clock": clock,
            "workers": 2,
            "regions": REGIONS,
            # One example per fit: the modelled compute is 1 ms, as the echo really takes.
            "compute": {"samples_per_s": 1000},
        },
    }


def _run(clock: str, rounds: int, root: Path, lock: bool) -> dict[str, Any]:
    workdir = root / clock
    workdir.mkdir(parents=True, exist_ok=False)
    path = workdir / "run.yaml"
    path.write_text(yaml.safe_dump(run_config(clock, rounds, workdir)))
    command = [sys.executable, "-m", "geofl.server.cli.main", "simulate", "-c", str(path)]
    if lock:
        command = ["flock", LOCK, *command]
    env = {**os.environ, "GEOFL_BENCH_PARAMS": str(PARAMS)}
    started = time.perf_counter()
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if completed.returncode != 0:
        raise RuntimeError(
            f"{clock} run failed ({completed.returncode}):\n{completed.stderr[-3000:]}"
        )
    return {"clock": clock, "wall_s": wall, **_read(workdir / "run.db")}


def _read(db_path: Path) -> dict[str, Any]:
    db = open_database(f"sqlite:///{db_path}")
    try:
        with db.session() as session:
            rounds = [
                (r.number, r.duration_s)
                for r in session.scalars(select(Round).order_by(Round.number))
            ]
            fits = [
                {"round": number, "client": node.name, "region": node.region, "s": part.duration_s}
                for part, node, number in session.execute(
                    select(Participation, Node, Round.number)
                    .join(Node, Participation.node_id == Node.id)
                    .join(Round, Participation.round_id == Round.id)
                    .where(Participation.kind == "fit")
                )
            ]
    finally:
        db.close()
    return {"rounds": rounds, "fits": fits, "load_avg": os.getloadavg()[0]}


def compare(wall: dict[str, Any], virtual: dict[str, Any]) -> dict[str, Any]:
    """Per-round and per-region medians and the virtual clock's relative error."""

    def median_round(run: dict[str, Any]) -> float:
        return statistics.median(s for _, s in run["rounds"])

    def region_medians(run: dict[str, Any]) -> dict[str, float]:
        regions = sorted({f["region"] for f in run["fits"]})
        return {
            r: statistics.median(f["s"] for f in run["fits"] if f["region"] == r) for r in regions
        }

    wall_round, virtual_round = median_round(wall), median_round(virtual)
    wall_regions, virtual_regions = region_medians(wall), region_medians(virtual)
    return {
        "median_round_s": {"wall": wall_round, "virtual": virtual_round},
        "round_error": (virtual_round - wall_round) / wall_round,
        "per_round_s": {
            "wall": [s for _, s in wall["rounds"]],
            "virtual": [s for _, s in virtual["rounds"]],
        },
        "median_fit_s_by_region": {
            r: {
                "wall": wall_regions[r],
                "virtual": virtual_regions[r],
                "error": (virtual_regions[r] - wall_regions[r]) / wall_regions[r],
            }
            for r in wall_regions
        },
        "run_wall_s": {"wall": wall["wall_s"], "virtual": virtual["wall_s"]},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-lock", action="store_true", help="do not take the heavy-run lock")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep both runs (YAML, database) in this folder"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="geofl-honesty-") as tmp:
        root = args.keep if args.keep is not None else Path(tmp)
        wall = _run("wall", args.rounds, root, not args.no_lock)
        virtual = _run("virtual", args.rounds, root, not args.no_lock)
    result = {"workload": {"params": PARAMS, "clients": CLIENTS, "regions": REGIONS}}
    result |= {"comparison": compare(wall, virtual), "wall": wall, "virtual": virtual}
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    summary = result["comparison"]
    print(json.dumps({k: summary[k] for k in ("median_round_s", "round_error")}, indent=2))
    print(json.dumps(summary["median_fit_s_by_region"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
