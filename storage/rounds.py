"""Writes about rounds and participations (see :mod:`geofl.storage.queries`).

A round's life: :func:`start_round` (or restart after a crash), :func:`set_round_phase`
as it advances, :func:`record_participation` per task attempt, then :func:`commit_round`
or :func:`fail_round`. Each function only flushes; the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, delete, distinct, func, select
from sqlalchemy.orm import Session

from geofl.storage.checkpoints import CheckpointRecord
from geofl.storage.errors import RecordNotFoundError, RoundStateError
from geofl.storage.models import (
    Checkpoint,
    Node,
    Participation,
    ParticipationStatus,
    Round,
    RoundPhase,
    RoundStatus,
    TaskKind,
)
from geofl.storage.reports import get_run
from geofl.storage.runs import add_event
from geofl.storage.values import aware_now as _now
from geofl.storage.values import choice
from geofl.storage.values import json_object as _metrics

__all__ = [
    "commit_round",
    "fail_round",
    "participation_values",
    "record_participation",
    "record_participations",
    "set_round_phase",
    "start_round",
]


def _get_round(session: Session, round_id: int) -> Round:
    row = session.get(Round, round_id)
    if row is None:
        raise RecordNotFoundError(f"round id {round_id} does not exist")
    return row


def start_round(
    session: Session,
    run_id: int,
    number: int,
    cohort_target: int,
    *,
    now: datetime | None = None,
) -> Round:
    """Begin round ``number`` of a run in phase ``select``.

    If a row for ``number`` is left from a crashed attempt (any status but
    ``committed``), it is reset, its participations are deleted and a
    ``round.restarted`` event is recorded, so resuming never trips the unique
    (run, number) constraint.

    Raises
    ------
    RoundStateError
        Round ``number`` is already committed.
    """
    if number < 1:
        raise ValueError(f"round numbers start at 1, got {number}")
    get_run(session, run_id)
    when = _now(now)
    statement = select(Round).where(Round.run_id == run_id, Round.number == number)
    row = session.scalars(statement).one_or_none()
    if row is None:
        row = Round(run_id=run_id, number=number)
        session.add(row)
    elif row.status == RoundStatus.COMMITTED.value:
        raise RoundStateError(f"round {number} of run {run_id} is already committed")
    else:
        previous = row.status
        session.execute(delete(Participation).where(Participation.round_id == row.id))
        add_event(
            session,
            "round.restarted",
            f"round {number} restarted after an interrupted attempt ({previous})",
            run_id=run_id,
            round=number,
            now=when,
        )
    _reset_round(row, cohort_target, when)
    session.flush()
    return row


def _reset_round(row: Round, cohort_target: int, when: datetime) -> None:
    row.status = RoundStatus.RUNNING.value
    row.phase = RoundPhase.SELECT.value
    row.started_at = when
    row.finished_at = None
    row.duration_s = None
    row.cohort_target = cohort_target
    row.num_selected = row.num_succeeded = row.num_failed = 0
    row.bytes_up = row.bytes_down = row.bytes_up_raw = row.bytes_down_raw = 0
    row.train_loss = row.eval_loss = row.server_eval_loss = None
    row.fit_metrics, row.eval_metrics, row.server_eval_metrics = {}, {}, {}
    row.phase_durations = {}
    row.checkpoint_id = None
    row.error = None


def _running_round(session: Session, round_id: int) -> Round:
    row = _get_round(session, round_id)
    if row.status != RoundStatus.RUNNING.value:
        raise RoundStateError(f"round {row.number} of run {row.run_id} is {row.status}")
    return row


def _add_phase_time(row: Round, seconds: float | None) -> None:
    if seconds is None:
        return
    durations = dict(row.phase_durations)
    durations[row.phase] = float(durations.get(row.phase, 0.0)) + seconds
    row.phase_durations = durations


def set_round_phase(
    session: Session,
    round_id: int,
    phase: RoundPhase | str,
    *,
    seconds_in_previous_phase: float | None = None,
) -> Round:
    """Move a running round to ``phase``.

    ``seconds_in_previous_phase``, if given, is added to ``phase_durations`` under the
    phase being left (adding, so a phase entered twice accumulates).
    """
    target = choice(RoundPhase, phase, "round phase").value
    row = _running_round(session, round_id)
    _add_phase_time(row, seconds_in_previous_phase)
    row.phase = target
    session.flush()
    return row


def participation_values(
    node_id: int,
    *,
    task_id: int,
    kind: TaskKind | str,
    status: ParticipationStatus | str,
    attempt: int = 1,
    reason: str | None = None,
    num_examples: int = 0,
    bytes_up: int = 0,
    bytes_down: int = 0,
    bytes_up_raw: int | None = None,
    bytes_down_raw: int | None = None,
    compute_s: float | None = None,
    duration_s: float | None = None,
    loss: float | None = None,
    metrics: Mapping[str, Any] | None = None,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
) -> dict[str, Any]:
    """One participation's columns, validated (what :func:`record_participations` takes).

    Raises
    ------
    ValueError
        On an unknown kind or status, or metrics that are not JSON-safe.
    """
    return {
        "node_id": node_id,
        "task_id": task_id,
        "attempt": attempt,
        "kind": choice(TaskKind, kind, "task kind").value,
        "status": choice(ParticipationStatus, status, "participation status").value,
        "reason": reason,
        "num_examples": num_examples,
        "bytes_up": bytes_up,
        "bytes_down": bytes_down,
        "bytes_up_raw": bytes_up if bytes_up_raw is None else bytes_up_raw,
        "bytes_down_raw": bytes_down if bytes_down_raw is None else bytes_down_raw,
        "compute_s": compute_s,
        "duration_s": duration_s,
        "loss": loss,
        "metrics": _metrics(metrics, "metrics"),
        "started_at": _now(started_at),
        "finished_at": None if finished_at is None else _now(finished_at),
    }


def record_participation(
    session: Session, round_id: int, node_id: int, **fields: Any
) -> Participation:
    """Record (or update) one task attempt, keyed by (round, ``task_id``, ``attempt``).

    ``fields`` are those of :func:`participation_values`. Recording the same key again
    overwrites it, so a retried upload or a late status change is idempotent. Every
    selected node should get a row (``dropped`` if it never answered): :func:`commit_round`
    derives the round's counts from these rows.
    """
    # Validate everything before touching the session, so a bad argument leaves no
    # half-built row behind for the caller's commit.
    values = participation_values(node_id, **fields)
    rows = record_participations(session, round_id, [values])
    return rows[0]


def record_participations(
    session: Session, round_id: int, rows: Sequence[Mapping[str, Any]]
) -> list[Participation]:
    """Record many attempts of one round in one go (values from :func:`participation_values`).

    Two queries however many rows: which nodes belong to the run, and which keys exist
    already (those rows are overwritten, as in :func:`record_participation`).

    Raises
    ------
    RecordNotFoundError
        If the round does not exist, or a node is not part of the round's run.
    """
    row = _get_round(session, round_id)
    node_ids = {values["node_id"] for values in rows}
    known = set(
        session.scalars(select(Node.id).where(Node.id.in_(node_ids), Node.run_id == row.run_id))
    )
    unknown = sorted(node_ids - known)
    if unknown:
        raise RecordNotFoundError(f"node {unknown[0]} is not part of run {row.run_id}")
    task_ids = {values["task_id"] for values in rows}
    existing = {
        (p.task_id, p.attempt): p
        for p in session.scalars(
            select(Participation).where(
                Participation.round_id == round_id, Participation.task_id.in_(task_ids)
            )
        )
    }
    written: list[Participation] = []
    for values in rows:
        participation = existing.get((values["task_id"], values["attempt"]))
        if participation is None:
            participation = Participation(round_id=round_id)
            session.add(participation)
            existing[(values["task_id"], values["attempt"])] = participation
        for name, value in values.items():
            setattr(participation, name, value)
        written.append(participation)
    session.flush()
    return written


def _participation_totals(session: Session, round_id: int) -> tuple[int, int, int, int, int, int]:
    fit = Participation.kind == TaskKind.FIT.value
    ok = and_(fit, Participation.status == ParticipationStatus.OK.value)
    statement = select(
        func.count(distinct(case((fit, Participation.task_id)))),
        func.count(distinct(case((ok, Participation.task_id)))),
        func.coalesce(func.sum(Participation.bytes_up), 0),
        func.coalesce(func.sum(Participation.bytes_down), 0),
        func.coalesce(func.sum(Participation.bytes_up_raw), 0),
        func.coalesce(func.sum(Participation.bytes_down_raw), 0),
    ).where(Participation.round_id == round_id)
    row = session.execute(statement).one()
    # PostgreSQL sums BIGINT into NUMERIC, which arrives as Decimal.
    selected, succeeded, up, down, up_raw, down_raw = (int(value) for value in row)
    return selected, succeeded, up, down, up_raw, down_raw


def _add_checkpoint(session: Session, row: Round, record: CheckpointRecord, when: datetime) -> int:
    if record.sha256 is None:  # a model checkpoint is content-addressed
        raise ValueError(f"checkpoint {record.path} has no SHA-256 (saved with a CRC-32?)")
    saved = Checkpoint(
        run_id=row.run_id,
        round=row.number,
        path=record.path,
        sha256=record.sha256,
        size_bytes=record.size_bytes,
        num_tensors=record.num_tensors,
        created_at=when,
    )
    session.add(saved)
    session.flush()
    return saved.id


def commit_round(
    session: Session,
    round_id: int,
    *,
    checkpoint: CheckpointRecord | None,
    train_loss: float | None = None,
    fit_metrics: Mapping[str, Any] | None = None,
    eval_loss: float | None = None,
    eval_metrics: Mapping[str, Any] | None = None,
    server_eval_loss: float | None = None,
    server_eval_metrics: Mapping[str, Any] | None = None,
    seconds_in_last_phase: float | None = None,
    epsilon: float | None = None,
    now: datetime | None = None,
) -> Round:
    """Finish a running round: checkpoint row, totals, status, and the run's progress.

    ``epsilon`` is the run's privacy spent after the round (None without privacy).

    Counts come from the round's ``fit`` participations: ``num_selected`` distinct
    tasks, ``num_succeeded`` of them with an ``ok`` attempt, ``num_failed`` the rest;
    bytes are summed over all participations. The run's ``last_committed_round``
    advances. Call it inside the same transaction as nothing else that may fail later.

    Raises
    ------
    RoundStateError
        The round is not running (already committed, failed or aborted).
    """
    when = _now(now)
    fit, evaluation, server_evaluation = (
        _metrics(fit_metrics, "fit_metrics"),
        _metrics(eval_metrics, "eval_metrics"),
        _metrics(server_eval_metrics, "server_eval_metrics"),
    )
    row = _running_round(session, round_id)
    run = get_run(session, row.run_id)
    if checkpoint is not None:
        row.checkpoint_id = _add_checkpoint(session, row, checkpoint, when)
    selected, succeeded, *traffic = _participation_totals(session, row.id)
    row.bytes_up, row.bytes_down, row.bytes_up_raw, row.bytes_down_raw = traffic
    row.num_selected, row.num_succeeded, row.num_failed = selected, succeeded, selected - succeeded
    row.train_loss, row.eval_loss, row.server_eval_loss = train_loss, eval_loss, server_eval_loss
    row.fit_metrics, row.eval_metrics, row.server_eval_metrics = fit, evaluation, server_evaluation
    _add_phase_time(row, seconds_in_last_phase)
    row.epsilon = epsilon
    row.phase = RoundPhase.COMMIT.value
    _close_round(row, RoundStatus.COMMITTED, when)
    run.last_committed_round = max(run.last_committed_round, row.number)
    run.updated_at = when
    session.flush()
    return row


def _close_round(row: Round, status: RoundStatus, when: datetime) -> None:
    row.status = status.value
    row.finished_at = when
    row.duration_s = max(0.0, (when - row.started_at).total_seconds())


def fail_round(
    session: Session,
    round_id: int,
    error: str,
    *,
    status: RoundStatus | str = RoundStatus.FAILED,
    now: datetime | None = None,
) -> Round:
    """Close a round without committing it: ``failed`` (an error) or ``aborted`` (stopped).

    A later :func:`start_round` for the same number resets it.
    """
    final = choice(RoundStatus, status, "round status")
    if final not in (RoundStatus.FAILED, RoundStatus.ABORTED):
        raise ValueError(f"fail_round takes status failed or aborted, not {final.value}")
    row = _get_round(session, round_id)
    if row.status == RoundStatus.COMMITTED.value:
        raise RoundStateError(f"round {row.number} of run {row.run_id} is already committed")
    row.error = error
    _close_round(row, final, _now(now))
    session.flush()
    return row
