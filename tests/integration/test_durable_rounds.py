"""Durable rounds: a coordinator SIGKILLed mid-fit keeps the updates it had accepted.

Accepted fit updates are staged on disk and in the database before the client hears
``accepted`` (:mod:`geofl.server.models.staging`). Restarted, the coordinator continues the
interrupted round: it folds the staged updates again and asks only the other clients to
train, and the round's aggregate is the one an uninterrupted run gives. The same holds
for DiLoCo's partially synchronized rounds (segments streamed during training, staged once
the trailer is in). Each case kills a real ``geofl server`` subprocess with SIGKILL.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries
from geofl.storage.queries import StagedUpdateRecord
from geofl.storage.records import RunDetail

from .processes import free_port, start_client, start_geofl, write_config

pytestmark = pytest.mark.timeout(300)


def _staged(db_url: str) -> list[StagedUpdateRecord]:
    try:
        with open_database(db_url, migrate=False, retry_s=0) as db, db.session() as session:
            runs = queries.list_runs(session)
            return queries.staged_updates(session, runs[0].id) if runs else []
    except Exception:  # the server may not have created the schema yet, or holds a lock
        return []


def _trained(tmp_path: Path, index: int) -> list[int]:
    path = tmp_path / f"{index}.log"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@dataclass
class Killed:
    """What a run killed with two updates staged left, and how it ended after a restart."""

    staged_at_kill: list[StagedUpdateRecord]
    detail: RunDetail
    weights: dict[str, Any]
    staged_dir: Path


def _kill_and_restart(
    tmp_path: Path, fast: str = "behaviour=ok", slow_s: float = 6, **sections: Any
) -> Killed:
    """Four clients (sites 0 and 1 answer as ``fast`` says, 2 and 3 take ``slow_s``); SIGKILL
    the server once two of the fast sites' updates are staged, restart it and let the run
    finish."""
    port = free_port()
    config = write_config(
        tmp_path,
        evaluation={"every": 0},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 4},
        server={"address": f"127.0.0.1:{port}", "heartbeat_interval_s": 0.5},
        **sections,
    )
    db_url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    server = start_geofl(tmp_path, "server", "-v", "-c", str(config))
    clients: list[subprocess.Popen[str]] = [
        start_client(
            tmp_path,
            port,
            i,
            f"{fast if i < 2 else f'behaviour=slow delay_s={slow_s}'} count-dir={tmp_path}",
            verbose=True,
        )
        for i in range(4)
    ]
    try:
        deadline = time.monotonic() + 90
        while len(_staged(db_url)) < 2:
            assert time.monotonic() < deadline, "the fast updates were never staged"
            assert server.poll() is None, server.communicate()[0]
            time.sleep(0.05)
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=10)
        staged = _staged(db_url)
        restarted = start_geofl(tmp_path, "server", "-v", "-c", str(config))
        output, _ = restarted.communicate(timeout=150)
        (tmp_path / "server.log").write_text(output)
        assert restarted.returncode == 0, output
        for index, client in enumerate(clients):
            out, _ = client.communicate(timeout=90)
            (tmp_path / f"site-{index}.log").write_text(out)
            assert client.returncode == 0, out
    finally:
        for process in (server, *clients):
            if process.poll() is None:
                process.kill()
            if process.stdout is not None and not process.stdout.closed:
                process.communicate()
    with open_database(db_url, migrate=False) as db, db.session() as session:
        run = queries.list_runs(session)[0]
        assert run.status == "completed"
        detail = queries.run_detail(session, run.id)
        row = queries.latest_checkpoint(session, run.id)
        assert queries.staged_updates(session, run.id) == []  # cleared once used
    assert row is not None
    checkpoints = tmp_path / "runs" / "checkpoints"
    weights, _ = CheckpointStore(checkpoints).load(CheckpointRecord.from_row(row))
    return Killed(staged, detail, dict(weights), checkpoints / "staged")


def _fits(detail: RunDetail, number: int) -> list[Any]:
    return [p for p in detail.participations if p.round_number == number and p.kind == "fit"]


def _assert_fast_sites_trained_round_1_once(tmp_path: Path) -> None:
    """The fast sites trained round 1 exactly as often as round 2 (which nobody
    interrupted): their staged updates were not asked for again."""
    for index in (0, 1):
        trained = _trained(tmp_path, index)
        assert trained.count(1) == trained.count(2) >= 1, trained


def test_sigkill_mid_fit_keeps_accepted_updates(tmp_path: Path) -> None:
    killed = _kill_and_restart(
        tmp_path,
        run={"rounds": 2},
        schedule={"deadline_s": 60, "wait_for_clients_s": 60},
    )
    assert len(killed.staged_at_kill) == 2
    _assert_fast_sites_trained_round_1_once(tmp_path)
    assert _trained(tmp_path, 2).count(1) >= 1 and _trained(tmp_path, 3).count(1) >= 1
    first = _fits(killed.detail, 1)
    # One successful fit per site in round 1, none recorded twice.
    assert sorted(p.node_name for p in first if p.status == "ok") == [f"site-{i}" for i in range(4)]
    assert all(r.status == "committed" for r in killed.detail.rounds)
    # The aggregate an uninterrupted run gives: sum((1+p) * 10(p+1)) / sum(10(p+1)) = 3
    # per round (tests/integration/test_rounds.py checks the uninterrupted figure).
    np.testing.assert_allclose(killed.weights["w"], 6.0, rtol=1e-6)
    np.testing.assert_allclose(killed.weights["b"], 6.0, rtol=1e-6)
    assert int(killed.weights["steps"]) == 2
    assert not list(killed.staged_dir.glob("*.safetensors"))


def test_sigkill_mid_fit_of_a_partial_sync_round_keeps_accepted_updates(tmp_path: Path) -> None:
    """DiLoCo with two sync points: an update streamed in segments is staged once whole."""
    killed = _kill_and_restart(
        tmp_path,
        run={"rounds": 2},
        schedule={
            "mode": "diloco",
            "deadline_s": 60,
            "wait_for_clients_s": 60,
            "diloco": {"local_steps": 4, "outer_lr": 1.0, "outer_momentum": 0.0},
            "partial_sync": {"sync_points": 2, "tail_steps": 2, "keep_local": False},
        },
    )
    staged_tasks = {r.task_id for r in killed.staged_at_kill}
    assert len(staged_tasks) == 2
    _assert_fast_sites_trained_round_1_once(tmp_path)
    first = _fits(killed.detail, 1)
    assert sorted(p.node_name for p in first if p.status == "ok") == [f"site-{i}" for i in range(4)]
    # The staged updates were folded with the participations their nodes earned before.
    assert staged_tasks <= {p.task_id for p in first if p.status == "ok"}
    assert all(r.status == "committed" for r in killed.detail.rounds)
    # Outer SGD with lr 1 and no momentum from a zero model: each round adds the weighted
    # mean update. The test app's update does not depend on the model it starts from and
    # (keep_local: false) clients carry nothing from one round to the next, so the
    # interrupted round 1 must have moved the model exactly as far as round 2 did.
    after_1 = _round_1_w(tmp_path)
    assert np.abs(after_1).max() > 0
    np.testing.assert_allclose(killed.weights["w"] - after_1, after_1, rtol=1e-5)
    assert not list(killed.staged_dir.glob("*.safetensors"))


def _round_1_w(tmp_path: Path) -> Any:
    db_url = f"sqlite:///{tmp_path / 'runs' / 'geofl.db'}"
    with open_database(db_url, migrate=False) as db, db.session() as session:
        run = queries.list_runs(session)[0]
        rows = queries.checkpoints_of(session, run.id)
    store = CheckpointStore(tmp_path / "runs" / "checkpoints")
    by_round = {r.round: r for r in rows}
    weights, _ = store.load(CheckpointRecord.from_row(by_round[1]))
    return weights["w"]


def test_sigkill_with_a_half_full_fedbuff_buffer_keeps_the_buffered_updates(
    tmp_path: Path,
) -> None:
    """FedBuff, K = 4: killed with two updates in the buffer, restarted, the buffer is
    refilled with them (their task ids, no second participation) plus two arrivals."""
    killed = _kill_and_restart(
        tmp_path,
        fast="behaviour=slow delay_s=1",
        slow_s=8,
        run={"rounds": 2},
        schedule={
            "mode": "async",
            "deadline_s": 60,
            "wait_for_clients_s": 60,
            "fedbuff": {"buffer_size": 4, "concurrency": 4, "updates": 2},
        },
    )
    staged_tasks = {r.task_id for r in killed.staged_at_kill}
    assert len(staged_tasks) == 2
    assert all(r.status == "committed" for r in killed.detail.rounds)
    assert [r.number for r in killed.detail.rounds] == [1, 2]
    fits = [p for p in killed.detail.participations if p.kind == "fit"]
    first = [p for p in fits if p.round_number == 1 and p.status == "ok"]
    assert len(first) == 4  # K updates made version 1
    # The buffered updates were taken in with the participations their nodes earned
    # before the kill, and no task was recorded twice.
    assert staged_tasks <= {p.task_id for p in first}
    task_ids = [p.task_id for p in fits]
    assert len(task_ids) == len(set(task_ids))
    assert not list(killed.staged_dir.glob("*.safetensors"))
