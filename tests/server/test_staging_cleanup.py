"""Staged updates nothing will fold go, with their files.

A file written for a row that was never recorded (the coordinator killed in between)
goes when the next coordinator starts; everything a run still has staged goes when it
ends for good, and an update written while it ends removes itself.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.protocols.types import Weights, WeightsView
from geofl.server.models.staging import STAGED_DIRECTORY, DurableUploads
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage import CheckpointRecord, CheckpointStore, Database, open_database, queries


def _update(value: float) -> Weights:
    return {"w": np.full((2, 3), value, np.float32), "b": np.full(1, value, np.float32)}


def _run(tmp_path: Path) -> tuple[Database, int, int]:
    db = open_database(f"sqlite:///{tmp_path / 'geofl.db'}")
    with db.session() as session:
        run_id = queries.create_run(session, "cleanup", {}, rounds_planned=2).id
        node_id = queries.upsert_node(session, run_id, "site-0", None).id
    return db, run_id, node_id


async def _stage(uploads: DurableUploads, node_id: int, task_id: int, value: float) -> None:
    task = TaskRecord(
        task_id=task_id,
        node_id=node_id,
        kind="fit",
        round=1,
        model_version=0,
        config={},
        deadline=0.0,
        future=asyncio.get_running_loop().create_future(),
        issued_at=1.0,
    )
    outcome = Outcome("ok", num_examples=10, payload=DeltaUpdate(_update(value)))
    await uploads.stage(task, outcome)


def _staged(db: Database, run_id: int) -> list[int]:
    with db.session() as session:
        return [r.task_id for r in queries.staged_updates(session, run_id)]


def _files(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "checkpoints" / STAGED_DIRECTORY).glob("*.safetensors")}


def test_a_file_whose_row_was_never_recorded_goes_when_the_next_coordinator_starts(
    tmp_path: Path,
) -> None:
    db, run_id, node_id = _run(tmp_path)
    uploads = DurableUploads(db, tmp_path / "checkpoints", run_id)
    asyncio.run(_stage(uploads, node_id, 1, 1.0))
    [kept] = _files(tmp_path)
    # What a coordinator killed between an update's file and its row leaves: the file
    # in place under its final name, no row. Another run's file shares the folder.
    store = CheckpointStore(tmp_path / "checkpoints" / STAGED_DIRECTORY)
    orphan = store.save(run_id, 1, _update(2.0))
    other_run = store.save(run_id + 1, 1, _update(2.0))

    restarted = DurableUploads(db, tmp_path / "checkpoints", run_id)
    assert restarted.discard_partial_writes() == 1
    assert _files(tmp_path) == {kept, other_run.path}
    assert orphan.path != other_run.path
    [resumed] = restarted.buffered()
    assert resumed.record.task_id == 1
    np.testing.assert_array_equal(resumed.load()["w"], _update(1.0)["w"])


def test_a_run_that_ended_drops_everything_it_had_staged(tmp_path: Path) -> None:
    db, run_id, node_id = _run(tmp_path)
    uploads = DurableUploads(db, tmp_path / "checkpoints", run_id)

    async def scenario() -> None:
        await _stage(uploads, node_id, 1, 1.0)  # arrived after the last version,
        await _stage(uploads, node_id, 2, 2.0)  # or more than a restart's versions took
        CheckpointStore(tmp_path / "checkpoints" / STAGED_DIRECTORY).save(run_id, 1, _update(3.0))
        uploads.close()
        await _stage(uploads, node_id, 3, 4.0)  # an upload once the run is over

    other = CheckpointStore(tmp_path / "checkpoints" / STAGED_DIRECTORY).save(
        run_id + 1, 1, _update(1.0)
    )
    asyncio.run(scenario())
    assert _staged(db, run_id) == []
    assert _files(tmp_path) == {other.path}


def test_an_update_written_while_the_run_ends_removes_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end sweeps after the update's file is written and before its row is."""
    db, run_id, node_id = _run(tmp_path)
    uploads = DurableUploads(db, tmp_path / "checkpoints", run_id)
    save = CheckpointStore.save

    def save_then_end(
        store: CheckpointStore, run_id: int, round: int, weights: WeightsView, **kw: Any
    ) -> CheckpointRecord:
        record = save(store, run_id, round, weights, **kw)
        uploads.close()
        return record

    monkeypatch.setattr(CheckpointStore, "save", save_then_end)
    asyncio.run(_stage(uploads, node_id, 1, 1.0))
    assert _staged(db, run_id) == []
    assert _files(tmp_path) == set()
