"""Writes about runs, nodes and events (see :mod:`geofl.storage.queries`).

Each function takes the caller's session and only flushes: the caller's
``database.session()`` block is the transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from geofl.storage.errors import RecordNotFoundError, RoundStateError
from geofl.storage.models import Event, Node, NodeStatus, Run, RunStatus
from geofl.storage.reports import get_run
from geofl.storage.values import aware_now as _now
from geofl.storage.values import choice, config_digest
from geofl.storage.values import json_object as _metrics

__all__ = [
    "add_event",
    "create_run",
    "find_resumable_run",
    "finish_run",
    "latest_run_named",
    "mark_node",
    "mark_run_nodes",
    "reopen_run",
    "upsert_node",
]


def create_run(
    session: Session,
    name: str,
    config: Mapping[str, Any],
    rounds_planned: int,
    simulated_clock: bool = False,
    *,
    digest: str | None = None,
    now: datetime | None = None,
) -> Run:
    """Insert a new run in status ``running``.

    Parameters
    ----------
    config:
        The fully resolved configuration; stored as JSON with its
        :func:`~geofl.storage.values.config_digest` in ``config_sha256``.
    digest:
        The run's identity for resuming, if not the digest of all of ``config`` (the
        server leaves out what only watches a run, such as its metrics endpoint).
    simulated_clock:
        True when timestamps come from a virtual clock, so reports do not read them
        as wall time.
    """
    if rounds_planned < 0:
        raise ValueError(f"rounds_planned must be >= 0, got {rounds_planned}")
    when = _now(now)
    run = Run(
        name=name,
        status=RunStatus.RUNNING.value,
        config=_metrics(config, "config"),
        config_sha256=digest or config_digest(config),
        rounds_planned=rounds_planned,
        last_committed_round=0,
        simulated_clock=simulated_clock,
        created_at=when,
        updated_at=when,
    )
    session.add(run)
    session.flush()
    return run


def find_resumable_run(session: Session, name: str, config_sha256: str) -> Run | None:
    """The newest run named ``name`` that is resumable (``running`` or ``interrupted``)
    with this config digest.

    A coordinator restarted with the same YAML resumes it; with a changed config
    (another digest) nothing is found.
    """
    statement = (
        select(Run)
        .where(
            Run.name == name,
            Run.status.in_([s.value for s in RunStatus if s.resumable]),
            Run.config_sha256 == config_sha256,
        )
        .order_by(Run.id.desc())
        .limit(1)
    )
    return session.scalars(statement).first()


def latest_run_named(session: Session, name: str) -> Run | None:
    """The newest run named ``name``, whatever its status (``None``: the name is free)."""
    statement = select(Run).where(Run.name == name).order_by(Run.id.desc()).limit(1)
    return session.scalars(statement).first()


def reopen_run(session: Session, run_id: int, *, now: datetime | None = None) -> Run:
    """Set a resumable run back to ``running`` as a coordinator carries it on.

    Raises
    ------
    RoundStateError
        If the run already ended (completed, failed or cancelled): those never resume.
    """
    run = get_run(session, run_id)
    if not RunStatus(run.status).resumable:
        raise RoundStateError(f"run {run_id} is {run.status}; only a resumable run reopens")
    when = _now(now)
    run.status = RunStatus.RUNNING.value
    run.error = None
    run.finished_at = None
    run.updated_at = when
    session.flush()
    return run


def finish_run(
    session: Session,
    run_id: int,
    status: RunStatus | str,
    error: str | None = None,
    *,
    now: datetime | None = None,
) -> Run:
    """Mark how a run stopped: ``completed``, ``failed`` (with ``error``), ``cancelled`` or
    ``interrupted`` (resumable; ``finished_at`` is when it stopped)."""
    final = choice(RunStatus, status, "run status")
    if final is RunStatus.RUNNING:
        raise ValueError(
            "finish_run needs how the run stopped: completed, failed, cancelled or interrupted"
        )
    run = get_run(session, run_id)
    when = _now(now)
    run.status = final.value
    run.error = error
    run.finished_at = when
    run.updated_at = when
    session.flush()
    return run


def upsert_node(
    session: Session,
    run_id: int,
    name: str,
    region: str | None,
    node_config: Mapping[str, Any] | None = None,
    *,
    now: datetime | None = None,
) -> Node:
    """Register a node as ``online``, reusing its row (and id) if the name is known.

    A client that re-joins, even after a coordinator restart, gets its old node id back;
    its region and config are replaced by the ones it reports now.
    """
    when = _now(now)
    reported = _metrics(node_config, "node_config")
    get_run(session, run_id)
    statement = select(Node).where(Node.run_id == run_id, Node.name == name)
    node = session.scalars(statement).one_or_none()
    if node is None:
        node = Node(run_id=run_id, name=name, first_seen=when)
        session.add(node)
    node.region = region
    node.node_config = reported
    node.last_seen = when
    node.status = NodeStatus.ONLINE.value
    session.flush()
    return node


#: Names per ``IN (...)`` query (PostgreSQL drivers cap a statement's parameters).
_IN_CHUNK = 5000


def upsert_nodes(
    session: Session,
    run_id: int,
    nodes: Sequence[tuple[str, str | None]],
    *,
    now: datetime | None = None,
) -> list[int]:
    """:func:`upsert_node` for many ``(name, region)`` pairs with empty configs, in bulk.

    Two statements however many nodes (a simulation joins ten thousand at once); returns
    the node ids in the order given.
    """
    when = _now(now)
    get_run(session, run_id)
    names = [name for name, _ in nodes]
    if len(set(names)) != len(names):
        raise ValueError("node names must be unique")
    existing: dict[str, Node] = {}
    for start in range(0, len(names), _IN_CHUNK):  # bound the statement's parameter count
        chunk = names[start : start + _IN_CHUNK]
        statement = select(Node).where(Node.run_id == run_id, Node.name.in_(chunk))
        existing.update((node.name, node) for node in session.scalars(statement))
    for name, region in nodes:
        node = existing.get(name)
        if node is None:
            node = Node(run_id=run_id, name=name, first_seen=when)
            session.add(node)
            existing[name] = node
        node.region = region
        node.node_config = {}
        node.last_seen = when
        node.status = NodeStatus.ONLINE.value
    session.flush()
    return [existing[name].id for name in names]


def mark_node(
    session: Session, node_id: int, status: NodeStatus | str, *, now: datetime | None = None
) -> Node:
    """Set a node's status (``online``/``offline``/``shutdown``) and its ``last_seen``."""
    node = session.get(Node, node_id)
    if node is None:
        raise RecordNotFoundError(f"node {node_id} does not exist")
    node.status = choice(NodeStatus, status, "node status").value
    node.last_seen = _now(now)
    session.flush()
    return node


def mark_run_nodes(session: Session, run_id: int, status: NodeStatus | str) -> int:
    """Set every node of a run to ``status``; returns how many rows changed.

    A restarted coordinator marks all nodes ``offline`` until they reconnect.
    """
    value = choice(NodeStatus, status, "node status").value
    statement = update(Node).where(Node.run_id == run_id, Node.status != value).values(status=value)
    changed = session.execute(statement.execution_options(synchronize_session="fetch"))
    return int(getattr(changed, "rowcount", 0))


def add_event(
    session: Session,
    kind: str,
    message: str,
    *,
    run_id: int | None = None,
    round: int | None = None,
    data: Mapping[str, Any] | None = None,
    now: datetime | None = None,
) -> Event:
    """Append an event (e.g. ``run.resumed``, ``node.joined``) to the audit log."""
    event = Event(
        run_id=run_id,
        round=round,
        kind=kind,
        message=message,
        data=_metrics(data, "data"),
        created_at=_now(now),
    )
    session.add(event)
    session.flush()
    return event
