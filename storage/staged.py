"""Staged updates: the fit results a round accepted, recorded before they are acknowledged.

The coordinator writes one row per accepted fit update (and the update's tensors to a
CRC-checked file beside the checkpoints) *before* it answers the client's upload,
so an acknowledged update survives the coordinator being killed. A restarted coordinator
reads :func:`staged_updates` of the round it resumes, folds them again, and asks only the
other nodes to train. :func:`clear_staged` drops a round's rows once it has committed or
failed. Like the other query modules, every function takes the caller's session and only
flushes; :mod:`geofl.storage.queries` re-exports them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from geofl.storage.checkpoints import CheckpointRecord
from geofl.storage.models import Participation, Round, RoundStatus, StagedUpdate
from geofl.storage.reports import get_run
from geofl.storage.values import aware_now, json_object

__all__ = [
    "StagedUpdateRecord",
    "clear_staged",
    "clear_staged_round",
    "clear_staged_tasks",
    "consumed_tasks",
    "stage_update",
    "staged_updates",
]


@dataclass(frozen=True)
class StagedUpdateRecord:
    """One staged update as read back: its file and what its participation will say."""

    run_id: int
    round: int
    node_id: int
    task_id: int
    model_version: int
    file: CheckpointRecord
    num_examples: int
    loss: float | None
    metrics: Mapping[str, Any]
    compute_s: float | None
    bytes_up: int
    bytes_up_raw: int
    bytes_down: int
    bytes_down_raw: int
    started_at: datetime | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: StagedUpdate) -> StagedUpdateRecord:
        """The record of an ORM row."""
        return cls(
            run_id=row.run_id,
            round=row.round,
            node_id=row.node_id,
            task_id=row.task_id,
            model_version=row.model_version,
            file=CheckpointRecord(row.path, row.sha256, row.size_bytes, row.num_tensors, row.crc32),
            num_examples=row.num_examples,
            loss=row.loss,
            metrics=dict(row.metrics),
            compute_s=row.compute_s,
            bytes_up=row.bytes_up,
            bytes_up_raw=row.bytes_up_raw,
            bytes_down=row.bytes_down,
            bytes_down_raw=row.bytes_down_raw,
            started_at=row.started_at,
            created_at=row.created_at,
        )


def stage_update(session: Session, record: StagedUpdateRecord) -> StagedUpdate:
    """Record an accepted update; a second one of the same (run, task) replaces it.

    Replacing keeps the table at one update per task: an upload of a task the server
    has staged already (its acknowledgement lost) is not counted twice. One node may
    have several rows of one round: FedBuff gives a fast node several tasks per version.
    """
    get_run(session, record.run_id)
    row = session.scalars(
        select(StagedUpdate).where(
            StagedUpdate.run_id == record.run_id, StagedUpdate.task_id == record.task_id
        )
    ).one_or_none()
    if row is None:
        row = StagedUpdate(run_id=record.run_id, task_id=record.task_id)
        session.add(row)
    values: dict[str, Any] = {
        "round": record.round,
        "node_id": record.node_id,
        "model_version": record.model_version,
        "path": record.file.path,
        "sha256": record.file.sha256,
        "crc32": record.file.crc32,
        "size_bytes": record.file.size_bytes,
        "num_tensors": record.file.num_tensors,
        "num_examples": record.num_examples,
        "loss": record.loss,
        "metrics": json_object(record.metrics, "metrics"),
        "compute_s": record.compute_s,
        "bytes_up": record.bytes_up,
        "bytes_up_raw": record.bytes_up_raw,
        "bytes_down": record.bytes_down,
        "bytes_down_raw": record.bytes_down_raw,
        "started_at": None if record.started_at is None else aware_now(record.started_at),
        "created_at": aware_now(record.created_at),
    }
    for name, value in values.items():
        setattr(row, name, value)
    session.flush()
    return row


def staged_updates(
    session: Session, run_id: int, round: int | None = None
) -> list[StagedUpdateRecord]:
    """The run's staged updates (of one round if given), oldest first."""
    statement = select(StagedUpdate).where(StagedUpdate.run_id == run_id)
    if round is not None:
        statement = statement.where(StagedUpdate.round == round)
    rows = session.scalars(statement.order_by(StagedUpdate.id))
    return [StagedUpdateRecord.from_row(row) for row in rows]


def clear_staged(session: Session, run_id: int, *, keep_round: int | None = None) -> int:
    """Delete the run's staged rows, except those of ``keep_round``; how many went."""
    statement = delete(StagedUpdate).where(StagedUpdate.run_id == run_id)
    if keep_round is not None:
        statement = statement.where(StagedUpdate.round != keep_round)
    result: Any = session.execute(statement)
    return int(result.rowcount or 0)


def clear_staged_round(session: Session, run_id: int, round: int) -> int:
    """Delete the staged rows of one round (it committed or failed); how many went."""
    statement = delete(StagedUpdate).where(
        StagedUpdate.run_id == run_id, StagedUpdate.round == round
    )
    result: Any = session.execute(statement)
    return int(result.rowcount or 0)


def clear_staged_tasks(session: Session, run_id: int, task_ids: Collection[int]) -> int:
    """Delete the staged rows of these tasks (their updates were used or refused)."""
    if not task_ids:
        return 0
    statement = delete(StagedUpdate).where(
        StagedUpdate.run_id == run_id, StagedUpdate.task_id.in_(list(task_ids))
    )
    result: Any = session.execute(statement)
    return int(result.rowcount or 0)


def consumed_tasks(session: Session, run_id: int) -> set[int]:
    """Staged tasks whose participation a committed round recorded: already folded.

    A coordinator killed after committing a version but before clearing its staged rows
    must not fold those updates a second time.
    """
    statement = (
        select(Participation.task_id)
        .join(Round, Round.id == Participation.round_id)
        .join(
            StagedUpdate,
            (StagedUpdate.task_id == Participation.task_id) & (StagedUpdate.run_id == run_id),
        )
        .where(Round.run_id == run_id, Round.status == RoundStatus.COMMITTED.value)
    )
    return {int(task_id) for task_id in session.scalars(statement)}
