"""Secure aggregation end to end over real gRPC: exact sums, dropouts at every stage, aborts.

Clients run the real runtime in threads. A "crashing" client stops dead (no result, no more
heartbeats) when it receives the task of a chosen stage, as a process killed at that moment
would; the server notices through missed heartbeats and the protocol must carry on.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from geofl.client.runtime import ClientRuntime
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.cli.inspect import detail_tables
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

from .conftest import run_config

_STAGE_TASKS = {
    "advertise": pb.TASK_KIND_SECAGG_ADVERTISE,
    "share": pb.TASK_KIND_SECAGG_SHARE,
    "fit": pb.TASK_KIND_FIT,
    "unmask": pb.TASK_KIND_SECAGG_UNMASK,
}


class _CrashError(Exception):
    """Raised inside the runtime to stop it as a killed process would stop."""


def crashing_at(stage: str, round_number: int = 1) -> type[ClientRuntime]:
    """A runtime that dies on receiving ``stage``'s task in ``round_number``."""
    kind = _STAGE_TASKS[stage]

    class CrashingRuntime(ClientRuntime):
        def _handle(self, task: pb.Task) -> None:
            if task.kind == kind and task.round == round_number:
                raise _CrashError(f"crashed at {stage}")
            super()._handle(task)

        def run(self) -> None:
            # Heartbeats stop with the runtime: the server sees the node vanish.
            with contextlib.suppress(_CrashError):
                super().run()

    return CrashingRuntime


def _secure_config(tmp_path: Path, clients: int, **secure: Any) -> Any:
    return run_config(
        tmp_path,
        run={"name": "secure", "rounds": 1, "seed": 3},
        strategy={"name": "fedavg", "clients_per_round": clients, "min_clients": 2},
        schedule={"deadline_s": 30, "wait_for_clients_s": 30},
        evaluation={"every": 0},
        secure_aggregation={
            "enabled": True,
            "degree": "full",
            "max_examples": 1000,
            "stage_deadline_s": 20,
            **secure,
        },
    )


def _expected_step(partitions: list[int]) -> float:
    """Weighted mean of the test app's shift ``1 + p`` with weight ``10 (p + 1)``."""
    weights = [10 * (p + 1) for p in partitions]
    return sum(w * (p + 1) for w, p in zip(weights, partitions, strict=True)) / sum(weights)


def _final(config: Any, run_id: int) -> tuple[dict[str, np.ndarray], Any]:
    with open_database(config.storage.url, migrate=False) as db, db.session() as session:
        row = queries.latest_checkpoint(session, run_id)
        detail = queries.run_detail(session, run_id)
        assert row is not None
        record = CheckpointRecord.from_row(row)
    weights, _ = CheckpointStore(Path(config.storage.checkpoints)).load(record)
    return weights, detail


def _render(detail: Any) -> str:
    console = Console(width=400, record=True, file=io.StringIO())
    for table in detail_tables(detail):
        console.print(table)
    return console.export_text()


def test_secure_round_sums_exactly_and_records_its_stages(
    tmp_path: Path, serve: Any, database_url: str
) -> None:
    config = _secure_config(tmp_path, 5, degree=2)
    config = config.model_copy(
        update={"storage": config.storage.model_copy(update={"url": database_url})}
    )
    server = serve(config)
    for partition in range(5):
        server.add_client(partition)
    result = server.wait()
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    step = _expected_step(list(range(5)))
    np.testing.assert_allclose(weights["w"], np.full((4, 3), step, np.float32), atol=1e-5)
    assert int(weights["steps"]) == 1
    [round_row] = detail.rounds
    assert round_row.status == "committed"
    assert {"advertise", "share", "fit", "unmask"} <= set(round_row.phase_durations)
    kinds = sorted({(p.kind, p.status) for p in detail.participations})
    assert kinds == [("advertise", "ok"), ("fit", "ok"), ("share", "ok"), ("unmask", "ok")]
    # A masked upload is one uint32 per parameter plus the weight: the plaintext's size.
    fit_up = [p.bytes_up for p in detail.participations if p.kind == "fit"]
    assert all(16 * 4 <= b < 16 * 4 + 100 for b in fit_up), fit_up  # ~90 bytes of framing


@pytest.mark.parametrize("stage", ["advertise", "share", "fit", "unmask"])
@pytest.mark.parametrize("dropped", [1, 3], ids=["10pct", "30pct"])
def test_dropouts_at_each_stage_leave_the_survivors_sum(
    tmp_path: Path, serve: Any, stage: str, dropped: int
) -> None:
    """10 clients, threshold 7 of 10: losing 1 or 3 at any stage still yields their sum."""
    config = _secure_config(tmp_path, 10, threshold=0.66)
    server = serve(config)
    crashing = set(range(dropped))
    for partition in range(10):
        runtime = crashing_at(stage) if partition in crashing else ClientRuntime
        server.add_client(partition, runtime_class=runtime)
    result = server.wait(timeout=120)
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    # Clients that crash before uploading are not in the sum; those crashing at unmask are.
    contributors = list(range(10)) if stage == "unmask" else sorted(set(range(10)) - crashing)
    np.testing.assert_allclose(
        weights["w"], np.full((4, 3), _expected_step(contributors), np.float32), atol=1e-5
    )
    [round_row] = detail.rounds
    assert round_row.status == "committed"
    lost = [p for p in detail.participations if p.kind == stage and p.status != "ok"]
    assert len(lost) == dropped and all(p.status in ("dropped", "late") for p in lost)


def test_too_many_dropouts_abort_the_round_and_the_next_goes_on(tmp_path: Path, serve: Any) -> None:
    """Threshold = every client: one crash at unmask makes round 1 unrecoverable."""
    config = _secure_config(tmp_path, 4, threshold=1.0)
    config = config.model_copy(update={"run": config.run.model_copy(update={"rounds": 2})})
    server = serve(config)
    for partition in range(4):
        runtime = crashing_at("unmask") if partition == 0 else ClientRuntime
        server.add_client(partition, runtime_class=runtime)
    result = server.wait(timeout=120)
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    first, second = detail.rounds
    assert first.status == "failed" and "unmask" in (first.error or "")
    shown = _render(detail)  # what `geofl runs show` prints
    assert "secure aggregation aborted in stage unmask" in shown
    assert "dropped" in shown
    assert second.status == "committed"
    # Nothing of round 1 was applied: the model moved by round 2's three clients only.
    np.testing.assert_allclose(
        weights["w"], np.full((4, 3), _expected_step([1, 2, 3]), np.float32), atol=1e-5
    )


def test_shared_low_rank_projection_composes_with_masking(tmp_path: Path, serve: Any) -> None:
    """Rank-1 projection of the 4x3 weight: fewer ring elements, the bias still exact."""
    config = _secure_config(tmp_path, 4, low_rank={"rank": 1, "min_elements": 1})
    server = serve(config)
    for partition in range(4):
        server.add_client(partition)
    result = server.wait(timeout=60)
    assert result.status == "completed", result.error
    weights, detail = _final(config, result.run_id)
    step = _expected_step(list(range(4)))
    np.testing.assert_allclose(weights["b"], np.full(3, step, np.float32), atol=1e-5)
    w = weights["w"]
    # Every row of the constant delta projects onto the same shared direction q: rows equal,
    # each a multiple of q, never longer than the true row.
    np.testing.assert_allclose(w, np.broadcast_to(w[0], w.shape), atol=1e-5)
    assert np.linalg.norm(w[0]) <= np.linalg.norm(np.full(3, step)) + 1e-5
    assert not np.allclose(w, step, atol=1e-3)
    # 4 (w projected) + 3 (b) + 1 (steps) + 1 (weight) ring elements instead of 17.
    fit_up = [p.bytes_up for p in detail.participations if p.kind == "fit"]
    assert all(9 * 4 <= b < 9 * 4 + 100 for b in fit_up), fit_up  # ~90 bytes of framing
