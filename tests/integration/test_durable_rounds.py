"""Durable rounds: a coordinator SIGKILLed mid-fit keeps the updates it had accepted.

Accepted fit updates are staged on disk and in the database before the client hears
``accepted`` (:mod:`geofl.server.models.staging`). Restarted, the coordinator continues the
interrupted round: it folds the staged updates again and asks only the other clients to
train, and the round's aggregate is the one an uninterrupted run gives.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .processes import free_port, start_geofl, write_config


def _staged(db_url: str, round_number: int) -> int:
    try:
        with open_database(db_url, migrate=False) as db, db.session() as session:
            runs = queries.list_runs(session)
            if not runs:
                return 0
            return len(queries.staged_updates(session, runs[0].id, round_number))
    except Exception:  # the server may not have created the schema yet
        return 0


def _client(tmp_path: Path, port: int, index: int, behaviour: str) -> subprocess.Popen[str]:
    node_config = f"partition-id={index} behaviour={behaviour} delay_s=6 count-dir={tmp_path}"
    return start_geofl(
        tmp_path,
        "client",
        "--server",
        f"127.0.0.1:{port}",
        "--app",
        "geofl_testapp:client_app",
        "--name",
        f"site-{index}",
        "--reconnect-for",
        "60",
        "--node-config",
        node_config,
    )


def _trained(tmp_path: Path, index: int) -> list[int]:
    path = tmp_path / f"{index}.log"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def test_sigkill_mid_fit_keeps_accepted_updates(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(
        tmp_path,
        run={"rounds": 2},
        evaluation={"every": 0},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 4},
        schedule={"deadline_s": 60, "wait_for_clients_s": 60},
        server={"address": f"127.0.0.1:{port}", "heartbeat_interval_s": 0.5},
    )
    db_url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    server = start_geofl(tmp_path, "server", "-c", str(config))
    # Sites 0 and 1 answer at once; 2 and 3 take 6 s, so the kill lands between them.
    clients = [_client(tmp_path, port, i, "ok" if i < 2 else "slow") for i in range(4)]
    try:
        deadline = time.monotonic() + 90
        while _staged(db_url, 1) < 2:
            assert time.monotonic() < deadline, "the fast updates were never staged"
            assert server.poll() is None, server.communicate()[0]
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=10)
        assert _staged(db_url, 1) == 2
        restarted = start_geofl(tmp_path, "server", "-c", str(config))
        output, _ = restarted.communicate(timeout=150)
        assert restarted.returncode == 0, output
        assert "round 1/2 committed" in output and "4/4 tasks ok" in output
        for client in clients:
            out, _ = client.communicate(timeout=30)
            assert client.returncode == 0, out
    finally:
        for process in (server, *clients):
            if process.poll() is None:
                process.kill()
            if process.stdout is not None and not process.stdout.closed:
                process.communicate()

    # The fast sites trained round 1 once; the slow ones were mid-fit and trained again.
    assert _trained(tmp_path, 0).count(1) == 1 and _trained(tmp_path, 1).count(1) == 1
    assert _trained(tmp_path, 2).count(1) >= 1 and _trained(tmp_path, 3).count(1) >= 1
    with open_database(db_url, migrate=False) as db, db.session() as session:
        run = queries.list_runs(session)[0]
        assert run.status == "completed"
        detail = queries.run_detail(session, run.id)
        row = queries.latest_checkpoint(session, run.id)
        assert queries.staged_updates(session, run.id) == []  # cleared at commit
    assert row is not None
    first = [p for p in detail.participations if p.round_number == 1 and p.kind == "fit"]
    # One successful fit per site in round 1, none recorded twice.
    assert sorted(p.node_name for p in first if p.status == "ok") == [f"site-{i}" for i in range(4)]
    assert all(r.status == "committed" for r in detail.rounds)
    # The aggregate an uninterrupted run gives: sum((1+p) * 10(p+1)) / sum(10(p+1)) = 3
    # per round (tests/integration/test_rounds.py checks the uninterrupted figure).
    weights, _ = CheckpointStore(tmp_path / "runs" / "checkpoints").load(
        CheckpointRecord.from_row(row)
    )
    np.testing.assert_allclose(weights["w"], 6.0, rtol=1e-6)
    np.testing.assert_allclose(weights["b"], 6.0, rtol=1e-6)
    assert int(weights["steps"]) == 2
    assert not list((tmp_path / "runs" / "checkpoints" / "staged").glob("*.safetensors"))
