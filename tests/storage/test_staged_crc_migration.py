"""Revision 0009: staged updates carry a CRC-32; rows from before keep their SHA-256."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import inspect

from geofl.storage import (
    CheckpointRecord,
    Database,
    current_revision,
    downgrade,
    head_revision,
    queries,
    upgrade,
)
from geofl.storage.queries import StagedUpdateRecord


def _columns(database: Database) -> dict[str, bool]:
    columns = inspect(database.engine).get_columns("staged_updates")
    return {column["name"]: bool(column["nullable"]) for column in columns}


def _stage(database: Database, file: CheckpointRecord) -> int:
    with database.session() as session:
        run_id = queries.create_run(session, "staged", {}, rounds_planned=1).id
        node_id = queries.upsert_node(session, run_id, "site-0", None).id
        record = StagedUpdateRecord(
            run_id=run_id,
            round=1,
            node_id=node_id,
            task_id=7,
            model_version=0,
            file=file,
            num_examples=3,
            loss=None,
            metrics={},
            compute_s=None,
            bytes_up=0,
            bytes_up_raw=0,
            bytes_down=0,
            bytes_down_raw=0,
            started_at=None,
            created_at=dt.datetime(2026, 12, 7, tzinfo=dt.UTC),
        )
        queries.stage_update(session, record)
        return run_id


def _files(database: Database, run_id: int) -> list[CheckpointRecord]:
    with database.session() as session:
        return [r.file for r in queries.staged_updates(session, run_id)]


def test_a_crc_checked_file_is_stored_and_read_back(database: Database) -> None:
    file = CheckpointRecord("a.safetensors", None, 120, 2, crc32=0xFFFF_FFFF)
    run_id = _stage(database, file)
    assert _files(database, run_id) == [file]  # the largest CRC fits the column


def test_a_sha256_row_survives_down_to_0008_and_back(database: Database) -> None:
    file = CheckpointRecord("f" * 64 + ".safetensors", "f" * 64, 120, 2)
    run_id = _stage(database, file)
    downgrade(database, "0008")
    assert current_revision(database) == "0008"
    assert _columns(database)["sha256"] is False and "crc32" not in _columns(database)
    upgrade(database)
    assert current_revision(database) == head_revision()
    assert _columns(database)["sha256"] is True and _columns(database)["crc32"] is True
    assert _files(database, run_id) == [file]


def test_downgrade_refuses_while_a_row_has_only_a_crc(database: Database) -> None:
    _stage(database, CheckpointRecord("a.safetensors", None, 120, 2, crc32=5))
    with pytest.raises(RuntimeError, match="have only a CRC-32; clear staged_updates"):
        downgrade(database, "0008")
