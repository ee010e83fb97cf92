"""Read queries: look up runs and build the records ``geofl runs`` prints.

Like the writes in :mod:`geofl.storage.queries` (which re-exports these), every function
takes an explicit session and loads exactly what it returns: relationships are
``lazy="raise"``, so the joins are spelled out here.
"""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import ColumnElement, func, select
from sqlalchemy import inspect as inspect_schema
from sqlalchemy.orm import Session, undefer

from geofl.storage.errors import RunNotFoundError
from geofl.storage.models import Checkpoint, Node, Participation, Round, Run
from geofl.storage.records import ParticipationRecord, RoundSummary, RunDetail, RunSummary

__all__ = [
    "checkpoints_of",
    "get_run",
    "latest_checkpoint",
    "list_runs",
    "rounds_of",
    "run_detail",
    "run_summary",
]


def get_run(session: Session, run_id: int) -> Run:
    """The run row with this id.

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    run = session.get(Run, run_id)
    if run is None:
        raise RunNotFoundError(run_id)
    return run


def checkpoints_of(session: Session, run_id: int) -> list[Checkpoint]:
    """Every checkpoint row of a run, newest round first."""
    statement = (
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.round.desc(), Checkpoint.id.desc())
    )
    return list(session.scalars(statement))


def latest_checkpoint(session: Session, run_id: int) -> Checkpoint | None:
    """The checkpoint of the highest committed round of a run, if any.

    Checkpoint rows are only written by a round's commit, so the newest one is the
    model a resumed coordinator continues from.
    """
    statement = (
        select(Checkpoint)
        .where(Checkpoint.run_id == run_id)
        .order_by(Checkpoint.round.desc(), Checkpoint.id.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def _summaries(session: Session, where: ColumnElement[bool] | None = None) -> list[RunSummary]:
    nodes = select(Node.run_id, func.count(Node.id).label("count")).group_by(Node.run_id).subquery()
    traffic = (
        select(
            Round.run_id,
            func.sum(Round.bytes_up).label("up"),
            func.sum(Round.bytes_down).label("down"),
            func.sum(Round.bytes_up_raw).label("up_raw"),
            func.sum(Round.bytes_down_raw).label("down_raw"),
        )
        .group_by(Round.run_id)
        .subquery()
    )
    statement = (
        select(
            Run,
            nodes.c.count,
            traffic.c.up,
            traffic.c.down,
            traffic.c.up_raw,
            traffic.c.down_raw,
        )
        .outerjoin(nodes, nodes.c.run_id == Run.id)
        .outerjoin(traffic, traffic.c.run_id == Run.id)
        .order_by(Run.id)
    )
    if where is not None:
        statement = statement.where(where)
    return [
        _run_summary(run, count, *traffic) for run, count, *traffic in session.execute(statement)
    ]


def _run_summary(run: Run, nodes: int | None, *traffic: int | Decimal | None) -> RunSummary:
    up, down, up_raw, down_raw = (int(value or 0) for value in traffic)
    return RunSummary(
        id=run.id,
        name=run.name,
        status=run.status,
        config_sha256=run.config_sha256,
        rounds_planned=run.rounds_planned,
        last_committed_round=run.last_committed_round,
        simulated_clock=run.simulated_clock,
        created_at=run.created_at,
        updated_at=run.updated_at,
        finished_at=run.finished_at,
        error=run.error,
        num_nodes=int(nodes or 0),
        # SUM over BIGINT is NUMERIC on PostgreSQL (a Decimal here): converted above.
        bytes_up=up,
        bytes_down=down,
        bytes_up_raw=up_raw,
        bytes_down_raw=down_raw,
    )


def list_runs(session: Session) -> list[RunSummary]:
    """Every run, oldest first, with its node count and total traffic."""
    return _summaries(session)


def run_summary(session: Session, run_id: int) -> RunSummary:
    """One run with its node count and total traffic (a line of ``geofl runs list``).

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    found = _summaries(session, Run.id == run_id)
    if not found:
        raise RunNotFoundError(run_id)
    return found[0]


def rounds_of(session: Session, run_id: int) -> list[RoundSummary]:
    """Every round row of a run (committed or not), by round number."""
    query = select(Round).where(Round.run_id == run_id).order_by(Round.number)
    with_epsilon = _has_epsilon(session)
    if with_epsilon:
        query = query.options(undefer(Round.epsilon))
    return [_round_summary(row, with_epsilon) for row in session.scalars(query)]


def _has_epsilon(session: Session) -> bool:
    """Whether ``rounds.epsilon`` exists (revision 0007): runs show reads older databases."""
    columns = inspect_schema(session.connection()).get_columns("rounds")
    return any(column["name"] == "epsilon" for column in columns)


def _round_summary(row: Round, with_epsilon: bool = True) -> RoundSummary:
    return RoundSummary(
        id=row.id,
        number=row.number,
        status=row.status,
        phase=row.phase,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_s=row.duration_s,
        cohort_target=row.cohort_target,
        num_selected=row.num_selected,
        num_succeeded=row.num_succeeded,
        num_failed=row.num_failed,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
        bytes_up_raw=row.bytes_up_raw,
        bytes_down_raw=row.bytes_down_raw,
        train_loss=row.train_loss,
        fit_metrics=dict(row.fit_metrics),
        eval_loss=row.eval_loss,
        eval_metrics=dict(row.eval_metrics),
        server_eval_loss=row.server_eval_loss,
        server_eval_metrics=dict(row.server_eval_metrics),
        phase_durations=dict(row.phase_durations),
        checkpoint_id=row.checkpoint_id,
        error=row.error,
        epsilon=row.epsilon if with_epsilon else None,
    )


def _participation_record(
    row: Participation, number: int, name: str, region: str | None
) -> ParticipationRecord:
    return ParticipationRecord(
        id=row.id,
        round_id=row.round_id,
        round_number=number,
        node_id=row.node_id,
        node_name=name,
        node_region=region,
        task_id=row.task_id,
        kind=row.kind,
        attempt=row.attempt,
        status=row.status,
        reason=row.reason,
        num_examples=row.num_examples,
        bytes_up=row.bytes_up,
        bytes_down=row.bytes_down,
        bytes_up_raw=row.bytes_up_raw,
        bytes_down_raw=row.bytes_down_raw,
        compute_s=row.compute_s,
        duration_s=row.duration_s,
        loss=row.loss,
        metrics=dict(row.metrics),
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def run_detail(session: Session, run_id: int) -> RunDetail:
    """A run with its config, its rounds in order, and every participation.

    Participations carry their round number and their node's name and region, ordered
    by round, then by when they were recorded.

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    run = get_run(session, run_id)
    summary = run_summary(session, run_id)
    joined = (
        select(Participation, Round.number, Node.name, Node.region)
        .join(Round, Participation.round_id == Round.id)
        .join(Node, Participation.node_id == Node.id)
        .where(Round.run_id == run_id)
        .order_by(Round.number, Participation.id)
    )
    return RunDetail(
        run=summary,
        config=dict(run.config),
        rounds=tuple(rounds_of(session, run_id)),
        participations=tuple(
            _participation_record(row, number, name, region)
            for row, number, name, region in session.execute(joined)
        ),
    )
