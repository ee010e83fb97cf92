"""A coordinator killed with SIGKILL resumes from its database; clients reconnect alone."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np

from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .processes import free_port, start_geofl, write_config


def _committed(db_url: str) -> int:
    try:
        with open_database(db_url, migrate=False) as db, db.session() as session:
            runs = queries.list_runs(session)
            return runs[0].last_committed_round if runs else 0
    except Exception:  # the server may not have created the schema yet
        return 0


def test_sigkilled_server_resumes_after_last_committed_round(tmp_path: Path) -> None:
    port = free_port()
    rounds = 6
    config = write_config(
        tmp_path,
        run={"rounds": rounds},
        evaluation={"every": 0},
        server={"address": f"127.0.0.1:{port}", "heartbeat_interval_s": 0.5},
        simulation={"node_config": {"behaviour": "slow", "delay_s": 0.3}},
    )
    db_url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    server = start_geofl(tmp_path, "server", "-c", str(config))
    clients = [
        start_geofl(
            tmp_path,
            "client",
            "--server",
            f"127.0.0.1:{port}",
            "--app",
            "geofl_testapp:client_app",
            "--name",
            f"site-{i}",
            "--reconnect-for",
            "60",
            "--node-config",
            f"partition-id={i} behaviour=slow delay_s=0.3",
        )
        for i in range(2)
    ]
    try:
        deadline = time.monotonic() + 90
        while _committed(db_url) < 2:
            assert time.monotonic() < deadline, "rounds never committed"
            assert server.poll() is None, server.communicate()[0]
            time.sleep(0.1)
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=10)  # reap it and close its pipe
        killed_at = _committed(db_url)
        assert 2 <= killed_at < rounds
        restarted = start_geofl(tmp_path, "server", "-c", str(config))
        output, _ = restarted.communicate(timeout=120)
        assert restarted.returncode == 0, output
        assert f"resuming after round {killed_at}" in output
        for client in clients:
            out, _ = client.communicate(timeout=30)
            assert client.returncode == 0, out
    finally:
        for process in (server, *clients):
            if process.poll() is None:
                process.kill()
            if process.stdout is not None and not process.stdout.closed:
                process.communicate()

    with open_database(db_url, migrate=False) as db, db.session() as session:
        runs = queries.list_runs(session)
        assert len(runs) == 1 and runs[0].status == "completed"
        detail = queries.run_detail(session, runs[0].id)
        row = queries.latest_checkpoint(session, runs[0].id)
        assert row is not None
        record = CheckpointRecord.from_row(row)
    assert [r.number for r in detail.rounds] == list(range(1, rounds + 1))
    assert all(r.status == "committed" for r in detail.rounds)
    # Every committed round applied exactly once: (10*1 + 20*2) / 30 per round.
    weights, _ = CheckpointStore(tmp_path / "runs" / "checkpoints").load(record)
    np.testing.assert_allclose(weights["b"], rounds * 50 / 30, rtol=1e-6)
    assert int(weights["steps"]) == rounds
    # Same node ids after the restart: the clients re-joined by name.
    assert {p.node_name for p in detail.participations} == {"site-0", "site-1"}
    assert len({p.node_id for p in detail.participations}) == 2


def test_interrupted_server_exits_130_and_stays_resumable(tmp_path: Path) -> None:
    config = write_config(tmp_path, schedule={"wait_for_clients_s": 60})
    server = start_geofl(tmp_path, "server", "-c", str(config))
    db_url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with open_database(db_url, migrate=False) as db, db.session() as session:
                if queries.list_runs(session):
                    break
        except Exception:
            pass
        assert time.monotonic() < deadline
        time.sleep(0.1)
    server.send_signal(signal.SIGTERM)
    output, _ = server.communicate(timeout=30)
    assert server.returncode == 130, output
    assert "resumable" in output
    with open_database(db_url, migrate=False) as db, db.session() as session:
        assert queries.list_runs(session)[0].status == "interrupted"
