"""A staged update taken up again after a restart: its tensors, or a rejection that says why.

Both round engines (synchronous and FedBuff) fold staged updates through
:func:`geofl.server.models.staging.load_resumed`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from geofl.server.models.staging import DurableUploads, ResumedUpdate, load_resumed
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.storage import CheckpointStore, open_database, queries

UPDATE = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.float32([0.5])}


async def _staged_and_resumed(tmp_path: Path) -> ResumedUpdate:
    db = open_database(f"sqlite:///{tmp_path / 'geofl.db'}")
    with db.session() as session:
        run_id = queries.create_run(session, "resume", {}, rounds_planned=2).id
        node_id = queries.upsert_node(session, run_id, "site-0", None).id
    uploads = DurableUploads(db, tmp_path / "checkpoints", run_id)
    loop = asyncio.get_running_loop()
    task = TaskRecord(
        task_id=7,
        node_id=node_id,
        kind="fit",
        round=2,
        model_version=1,
        config={},
        deadline=0.0,
        future=loop.create_future(),
        issued_at=1.0,
    )
    outcome = Outcome("ok", num_examples=30, loss=0.25, payload=DeltaUpdate(dict(UPDATE)))
    await uploads.stage(task, outcome)
    [resumed] = uploads.resumed(2, version=1)
    return resumed


def test_a_staged_update_comes_back_with_its_tensors_and_figures(tmp_path: Path) -> None:
    async def scenario() -> tuple[TaskRecord, Outcome]:
        return await load_resumed(await _staged_and_resumed(tmp_path))

    task, outcome = asyncio.run(scenario())
    assert (task.task_id, task.round, task.model_version) == (7, 2, 1)
    assert (outcome.status, outcome.num_examples, outcome.loss) == ("ok", 30, 0.25)
    assert isinstance(outcome.payload, DeltaUpdate)
    tensors = dict(outcome.payload.tensors)
    assert sorted(tensors) == sorted(UPDATE)
    for name, array in UPDATE.items():
        np.testing.assert_array_equal(tensors[name], array)


@pytest.mark.parametrize("damage", ["flip a byte", "delete"])
def test_a_damaged_staged_file_is_a_rejection_with_its_reason(tmp_path: Path, damage: str) -> None:
    async def scenario() -> tuple[TaskRecord, Outcome]:
        resumed = await _staged_and_resumed(tmp_path)
        [path] = (tmp_path / "checkpoints" / "staged").glob("*.safetensors")
        if damage == "delete":
            path.unlink()
        else:
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))
        return await load_resumed(resumed)

    task, outcome = asyncio.run(scenario())
    assert task.task_id == 7
    assert outcome.status == "rejected"
    assert outcome.payload is None
    assert outcome.reason is not None and outcome.reason.startswith("staged update unusable")
    assert ("missing" if damage == "delete" else "CRC-32") in outcome.reason


def test_a_row_staged_before_revision_0009_is_verified_by_its_sha256(tmp_path: Path) -> None:
    """A coordinator upgraded mid-round finds rows with a SHA-256 and no CRC-32."""

    async def scenario() -> tuple[TaskRecord, Outcome]:
        resumed = await _staged_and_resumed(tmp_path)
        staged = tmp_path / "checkpoints" / "staged"
        old = CheckpointStore(staged).save(resumed.record.run_id, 2, UPDATE)  # SHA-256
        assert old.sha256 is not None and old.crc32 is None
        db = open_database(f"sqlite:///{tmp_path / 'geofl.db'}")
        with db.session() as session:
            queries.stage_update(session, replace(resumed.record, file=old))
        uploads = DurableUploads(db, tmp_path / "checkpoints", resumed.record.run_id)
        [again] = uploads.resumed(2, version=1)
        assert again.record.file == old
        return await load_resumed(again)

    _, outcome = asyncio.run(scenario())
    assert outcome.status == "ok" and isinstance(outcome.payload, DeltaUpdate)
    np.testing.assert_array_equal(dict(outcome.payload.tensors)["w"], UPDATE["w"])
