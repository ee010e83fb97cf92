"""Read queries for reports and CSV export: the run as series and a participation grid.

``geofl runs report`` and ``geofl runs export`` must stay fast for big runs (500 rounds of
1,000 clients is half a million participation rows), so nothing here builds ORM objects
per participation: traffic and the clients x rounds grid are aggregated in SQL, and the
export streams plain rows in batches (a server-side cursor on PostgreSQL). Like every
query module, functions take the caller's session; :mod:`geofl.storage.queries`
re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from geofl.storage.models import Node, Participation, Round
from geofl.storage.reports import get_run

__all__ = [
    "ExportedParticipation",
    "NodeCell",
    "NodeLabel",
    "RegionRoundTraffic",
    "iter_participations",
    "participation_cells",
    "participation_metric_keys",
    "region_traffic_by_round",
    "run_nodes",
]

#: Rows fetched per batch when streaming participations.
BATCH_ROWS = 5000


@dataclass(frozen=True)
class NodeLabel:
    """A node of a run, as the report labels it."""

    id: int
    name: str
    region: str | None


@dataclass(frozen=True)
class NodeCell:
    """One status a node ended a task with in one round (a cell may get several)."""

    round_number: int
    node_id: int
    status: str


@dataclass(frozen=True)
class RegionRoundTraffic:
    """Bytes moved by one region's nodes in one round (every task, every attempt)."""

    round_number: int
    region: str | None
    bytes_up: int
    bytes_down: int
    bytes_up_raw: int
    bytes_down_raw: int


class ExportedParticipation(NamedTuple):
    """One participation row as written to ``participations.csv``.

    A named tuple rather than a frozen dataclass like the other records: the export
    builds half a million of them for a big run, straight from the result rows.
    """

    round_number: int
    node_id: int
    node_name: str
    node_region: str | None
    task_id: int
    kind: str
    attempt: int
    status: str
    reason: str | None
    num_examples: int
    bytes_up: int
    bytes_down: int
    bytes_up_raw: int
    bytes_down_raw: int
    compute_s: float | None
    duration_s: float | None
    loss: float | None
    metrics: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None


def run_nodes(session: Session, run_id: int) -> list[NodeLabel]:
    """Every node of a run, by region (nodes without one last), then name.

    Raises
    ------
    RunNotFoundError
        No such run.
    """
    get_run(session, run_id)
    statement = select(Node.id, Node.name, Node.region).where(Node.run_id == run_id)
    nodes = [NodeLabel(id, name, region) for id, name, region in session.execute(statement)]
    return sorted(nodes, key=lambda n: (n.region is None, n.region or "", n.name, n.id))


def participation_cells(session: Session, run_id: int) -> list[NodeCell]:
    """The distinct (round, node, status) of each task's final attempt in a run.

    A retried task counts by its last attempt only (an upload that failed once and then
    arrived is ``ok``); a node with several tasks in a round (fit, evaluate, secure
    aggregation stages) gives one cell per distinct status, for the caller to combine.
    """
    get_run(session, run_id)
    last = (
        select(
            Participation.round_id,
            Participation.task_id,
            func.max(Participation.attempt).label("attempt"),
        )
        .join(Round, Participation.round_id == Round.id)
        .where(Round.run_id == run_id)
        .group_by(Participation.round_id, Participation.task_id)
        .subquery()
    )
    statement = (
        select(Round.number, Participation.node_id, Participation.status)
        .distinct()
        .join(Round, Participation.round_id == Round.id)
        .join(
            last,
            and_(
                last.c.round_id == Participation.round_id,
                last.c.task_id == Participation.task_id,
                last.c.attempt == Participation.attempt,
            ),
        )
        .where(Round.run_id == run_id)
    )
    return [NodeCell(number, node, status) for number, node, status in session.execute(statement)]


def region_traffic_by_round(session: Session, run_id: int) -> list[RegionRoundTraffic]:
    """Bytes per (round, region) over every participation of a run, by round then region."""
    get_run(session, run_id)
    statement = (
        select(
            Round.number,
            Node.region,
            func.coalesce(func.sum(Participation.bytes_up), 0),
            func.coalesce(func.sum(Participation.bytes_down), 0),
            func.coalesce(func.sum(Participation.bytes_up_raw), 0),
            func.coalesce(func.sum(Participation.bytes_down_raw), 0),
        )
        .join(Round, Participation.round_id == Round.id)
        .join(Node, Participation.node_id == Node.id)
        .where(Round.run_id == run_id)
        .group_by(Round.number, Node.region)
    )
    # PostgreSQL sums BIGINT into NUMERIC (a Decimal here), hence the int().
    rows = [
        RegionRoundTraffic(number, region, int(up), int(down), int(up_raw), int(down_raw))
        for number, region, up, down, up_raw, down_raw in session.execute(statement)
    ]
    return sorted(rows, key=lambda t: (t.round_number, t.region is None, t.region or ""))


def participation_metric_keys(session: Session, run_id: int) -> list[str]:
    """The sorted union of the metric names any participation of a run reported."""
    get_run(session, run_id)
    statement = (
        select(Participation.metrics)
        .join(Round, Participation.round_id == Round.id)
        .where(Round.run_id == run_id)
        .execution_options(yield_per=BATCH_ROWS)
    )
    keys: set[str] = set()
    for metrics in session.scalars(statement):
        keys.update(metrics)
    return sorted(keys)


def iter_participations(session: Session, run_id: int) -> Iterator[ExportedParticipation]:
    """Every participation of a run, by round number then recording order, streamed.

    Rows arrive in batches of :data:`BATCH_ROWS`, so memory stays flat however long the
    run; the session must stay open while the iterator is consumed.

    Raises
    ------
    RunNotFoundError
        No such run (raised on the first ``next()``).
    """
    get_run(session, run_id)
    p = Participation
    statement = (
        select(
            Round.number,
            p.node_id,
            Node.name,
            Node.region,
            p.task_id,
            p.kind,
            p.attempt,
            p.status,
            p.reason,
            p.num_examples,
            p.bytes_up,
            p.bytes_down,
            p.bytes_up_raw,
            p.bytes_down_raw,
            p.compute_s,
            p.duration_s,
            p.loss,
            p.metrics,
            p.started_at,
            p.finished_at,
        )
        .join(Round, p.round_id == Round.id)
        .join(Node, p.node_id == Node.id)
        .where(Round.run_id == run_id)
        .order_by(Round.number, p.id)
        .execution_options(yield_per=BATCH_ROWS)
    )
    for row in session.execute(statement):
        yield ExportedParticipation._make(row)
