"""How long ``geofl runs report`` and ``geofl runs export`` take on a big run.

Builds a run of ``--rounds`` rounds in which each of ``--clients`` clients (three regions)
gets a fit task every round (500 x 1,000 is half a million participation rows), with
mixed outcomes (90 % ok, 5 % late, 3 % dropped, 2 % failed), per-round accuracy and phase
timings; then times :func:`geofl.server.reports.write_report` and
:func:`geofl.server.reports.export_csv` on it, and reports the output sizes.

Rounds go through the storage API (``start_round`` ... ``commit_round``); participation
rows are validated by ``participation_values`` and inserted in one executemany per round
(``record_participations`` builds ORM objects, which would make the set-up, not the
measured part, take minutes).

Run as ``python -m benchmarks.report_scale --rounds 500 --clients 1000 --out DIR``; prints
JSON. ``--db URL`` uses that database instead of a new SQLite file in DIR.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert

from geofl.server.reports import export_csv, write_report
from geofl.storage import Database, open_database, queries
from geofl.storage.models import Participation

__all__ = ["build_run", "main", "measure"]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
REGIONS = ("eu-west", "us-east", "ap-south")
STATUSES = ("ok", "late", "dropped", "failed")
SHARES = (0.90, 0.05, 0.03, 0.02)


def _tasks(
    round_id: int, number: int, nodes: list[int], rng: np.random.Generator
) -> list[dict[str, Any]]:
    start = T0 + timedelta(seconds=60.0 * (number - 1))
    outcomes = rng.choice(len(STATUSES), size=len(nodes), p=SHARES)
    rows = []
    for index, (node, outcome) in enumerate(zip(nodes, outcomes, strict=True)):
        status = STATUSES[outcome]
        ok = status == "ok"
        values = queries.participation_values(
            node,
            task_id=number * 1_000_000 + index,
            kind="fit",
            status=status,
            num_examples=100 if ok else 0,
            bytes_up=400_000 if ok else 0,
            bytes_up_raw=1_600_000 if ok else 0,
            bytes_down=1_600_000,
            compute_s=1.0 if ok else None,
            duration_s=float(rng.uniform(5, 50)),
            loss=float(rng.uniform(0.1, 1.0)) if ok else None,
            metrics={"accuracy": float(rng.uniform(0.5, 0.9))} if ok else {},
            started_at=start,
            finished_at=start + timedelta(seconds=50),
        )
        rows.append({**values, "round_id": round_id})
    return rows


def build_run(db: Database, rounds: int, clients: int, seed: int = 0) -> int:
    """Write the run described in the module docstring; returns its id."""
    rng = np.random.default_rng(seed)
    with db.session() as session:
        run_id = queries.create_run(
            session, "report-scale", {"run": {"rounds": rounds}}, rounds, True, now=T0
        ).id
        nodes = [
            queries.upsert_node(session, run_id, f"client-{i:04d}", REGIONS[i % 3], now=T0).id
            for i in range(clients)
        ]
    for number in range(1, rounds + 1):
        start = T0 + timedelta(seconds=60.0 * (number - 1))
        with db.session() as session:
            round_id = queries.start_round(session, run_id, number, clients, now=start).id
            session.execute(insert(Participation), _tasks(round_id, number, nodes, rng))
            queries.set_round_phase(session, round_id, "fit", seconds_in_previous_phase=2.0)
            queries.set_round_phase(session, round_id, "aggregate", seconds_in_previous_phase=48.0)
            queries.commit_round(
                session,
                round_id,
                checkpoint=None,
                train_loss=1.0 / number,
                server_eval_metrics={"accuracy": 0.9 - 0.4 / number},
                seconds_in_last_phase=5.0,
                now=start + timedelta(seconds=55),
            )
    return run_id


def measure(db: Database, run_id: int, out: Path) -> dict[str, float]:
    """Seconds and bytes of one report and one export of run ``run_id`` into ``out``."""
    t0 = time.perf_counter()
    page = write_report(db, run_id, out / "report")
    report_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    exported = export_csv(db, run_id, out / "csv")
    export_s = time.perf_counter() - t0
    return {
        "report_s": report_s,
        "report_bytes": page.stat().st_size,
        "export_s": export_s,
        "rounds_csv_bytes": exported.rounds_csv.stat().st_size,
        "participations_csv_bytes": exported.participations_csv.stat().st_size,
        "participations": exported.participations,
    }


def main(argv: list[str] | None = None) -> None:
    """Build the run, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--out", type=Path, required=True, help="new folder for the outputs")
    parser.add_argument("--db", default=None, help="database URL (default: DIR/run.db)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True)
    url = args.db or f"sqlite:///{args.out / 'run.db'}"
    with open_database(url) as db:
        t0 = time.perf_counter()
        run_id = build_run(db, args.rounds, args.clients)
        build_s = time.perf_counter() - t0
        result = {"rounds": args.rounds, "clients": args.clients, "build_s": build_s}
        result.update(measure(db, run_id, args.out))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
