"""The end-of-run summary: time-to-accuracy and traffic per region, read from the database.

Everything comes from the stored rows, so the same summary describes a run on the
virtual clock (timestamps in simulated time, ``Run.simulated_clock`` set) and one on the
wall clock, live after ``geofl simulate`` or later from ``geofl runs show``.

Times are measured from the run's ``created_at`` to each round's ``finished_at``: for a
resumed wall-clock run that includes the time the coordinator was down. The followed
metric is "higher is better" (accuracy, F1...): the target is reached by the first
committed round whose value is at least the target, and the best value is the largest.
A round's value is its server-side evaluation of the metric if it has one, else its
federated evaluation; a value that is not a finite number (a diverged model stores
``"NaN"``) counts as not measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from geofl.storage import Database, queries
from geofl.storage.models import Node, Participation, Round, RoundStatus, Run

__all__ = [
    "NO_REGION",
    "RegionTraffic",
    "RoundPoint",
    "RunSummary",
    "metric_value",
    "render_summary",
    "summarize_run",
]

#: How nodes without a region are listed in the traffic table.
NO_REGION = "(none)"

_NOT_COMMITTED = (RoundStatus.FAILED.value, RoundStatus.ABORTED.value)


@dataclass(frozen=True)
class RoundPoint:
    """One finished round on the run's time line."""

    number: int
    status: str
    #: Seconds from the run's start to the round's end (simulated or wall, see the summary).
    elapsed_s: float
    #: The followed metric after this round; None if it was not measured.
    metric: float | None


@dataclass(frozen=True)
class RegionTraffic:
    """Bytes moved by the nodes of one region over the whole run."""

    region: str
    clients: int
    bytes_up: int
    bytes_down: int


@dataclass(frozen=True)
class RunSummary:
    """What a run achieved, in how much (simulated or wall) time, over which links.

    ``target_round``/``target_elapsed_s`` are None when no target was given or the run
    never reached it; ``best_*`` and ``final_*`` are None when the metric was never
    measured. ``final_*`` is the latest committed round that measured the metric.
    """

    run_id: int
    run_name: str
    simulated: bool
    rounds_planned: int
    rounds_committed: int
    #: Rounds closed without a commit (``failed`` or ``aborted``).
    rounds_failed: int
    #: Run start to the last finished round; 0.0 before any round finished.
    total_s: float
    metric: str
    target: float | None
    rounds: tuple[RoundPoint, ...]
    target_round: int | None
    target_elapsed_s: float | None
    best_metric: float | None
    best_round: int | None
    final_metric: float | None
    final_round: int | None
    regions: tuple[RegionTraffic, ...]
    bytes_up: int
    bytes_down: int

    @property
    def clock_unit(self) -> str:
        """``"simulated seconds"`` or ``"wall seconds"``: what every time here counts."""
        return "simulated seconds" if self.simulated else "wall seconds"


def metric_value(
    server_metrics: Mapping[str, object], federated_metrics: Mapping[str, object], name: str
) -> float | None:
    """The round's value of metric ``name``: server-side evaluation first, else federated.

    Returns None when neither has a finite number under ``name``.
    """
    for metrics in (server_metrics, federated_metrics):
        value = _finite(metrics.get(name))
        if value is not None:
            return value
    return None


def _finite(value: object) -> float | None:
    # bool is an int subclass, but True is no accuracy.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def summarize_run(
    db: Database, run_id: int, *, metric: str = "accuracy", target: float | None = None
) -> RunSummary:
    """Summarise run ``run_id`` from the database.

    Parameters
    ----------
    metric:
        The evaluation metric to follow (higher is better).
    target:
        The value whose first attainment is reported; None reports only the best value.

    Raises
    ------
    ValueError
        ``metric`` is empty or ``target`` is not a finite number.
    geofl.storage.RunNotFoundError
        No run has this id.
    """
    if not metric:
        raise ValueError("metric must name an evaluation metric, got an empty string")
    if target is not None and not math.isfinite(target):
        raise ValueError(f"target must be a finite number, got {target}")
    with db.session() as session:
        run = queries.get_run(session, run_id)
        points = _round_points(session, run, metric)
        regions = _region_traffic(session, run_id)
        return _summary(run, metric, target, points, regions)


def _round_points(session: Session, run: Run, metric: str) -> tuple[RoundPoint, ...]:
    statement = (
        select(Round)
        .where(Round.run_id == run.id, Round.finished_at.is_not(None))
        .order_by(Round.number)
    )
    return tuple(_point(row, run.created_at, metric) for row in session.scalars(statement))


def _point(row: Round, start: datetime, metric: str) -> RoundPoint:
    finished = row.finished_at if row.finished_at is not None else row.started_at
    committed = row.status == RoundStatus.COMMITTED.value
    value = metric_value(row.server_eval_metrics, row.eval_metrics, metric) if committed else None
    return RoundPoint(row.number, row.status, (finished - start).total_seconds(), value)


def _region_traffic(session: Session, run_id: int) -> tuple[RegionTraffic, ...]:
    statement = (
        select(
            Node.region,
            func.count(distinct(Participation.node_id)),
            func.coalesce(func.sum(Participation.bytes_up), 0),
            func.coalesce(func.sum(Participation.bytes_down), 0),
        )
        .join(Round, Participation.round_id == Round.id)
        .join(Node, Participation.node_id == Node.id)
        .where(Round.run_id == run_id)
        .group_by(Node.region)
    )
    # PostgreSQL sums BIGINT into NUMERIC (a Decimal here), hence the int().
    traffic = [
        RegionTraffic(region or NO_REGION, int(clients), int(up), int(down))
        for region, clients, up, down in session.execute(statement)
    ]
    return tuple(sorted(traffic, key=lambda t: (t.region == NO_REGION, t.region)))


def _summary(
    run: Run,
    metric: str,
    target: float | None,
    points: tuple[RoundPoint, ...],
    regions: tuple[RegionTraffic, ...],
) -> RunSummary:
    measured = [p for p in points if p.metric is not None]
    reached = next((p for p in measured if target is not None and _at_least(p, target)), None)
    best = max(measured, key=_value, default=None)
    final = measured[-1] if measured else None
    return RunSummary(
        run_id=run.id,
        run_name=run.name,
        simulated=run.simulated_clock,
        rounds_planned=run.rounds_planned,
        rounds_committed=sum(p.status == RoundStatus.COMMITTED.value for p in points),
        rounds_failed=sum(p.status in _NOT_COMMITTED for p in points),
        total_s=max((p.elapsed_s for p in points), default=0.0),
        metric=metric,
        target=target,
        rounds=points,
        target_round=None if reached is None else reached.number,
        target_elapsed_s=None if reached is None else reached.elapsed_s,
        best_metric=None if best is None else best.metric,
        best_round=None if best is None else best.number,
        final_metric=None if final is None else final.metric,
        final_round=None if final is None else final.number,
        regions=regions,
        bytes_up=sum(t.bytes_up for t in regions),
        bytes_down=sum(t.bytes_down for t in regions),
    )


def _value(point: RoundPoint) -> float:
    return -math.inf if point.metric is None else point.metric


def _at_least(point: RoundPoint, target: float) -> bool:
    return point.metric is not None and point.metric >= target


def render_summary(summary: RunSummary) -> RenderableType:
    """The summary as two tables: the run's outcome, then its traffic per region."""
    return Group(_outcome_table(summary), _traffic_table(summary))


def _outcome_table(summary: RunSummary) -> Table:
    unit = summary.clock_unit
    # Names come from configs and clients: printed as text, never parsed as markup.
    name, metric = escape(summary.run_name), escape(summary.metric)
    table = Table(title=f"run {summary.run_id} '{name}' summary ({unit})", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row(
        "rounds",
        f"{summary.rounds_committed} committed, {summary.rounds_failed} failed "
        f"of {summary.rounds_planned} planned",
    )
    table.add_row("total time", _duration(summary.total_s, unit))
    table.add_row(f"time to {metric}", _time_to_target(summary))
    table.add_row(f"best {metric}", _at_round(summary.best_metric, summary.best_round))
    table.add_row(f"final {metric}", _at_round(summary.final_metric, summary.final_round))
    return table


def _time_to_target(summary: RunSummary) -> str:
    if summary.target is None:
        return "no target given"
    goal = f">= {summary.target:.4g}"
    if summary.target_round is None or summary.target_elapsed_s is None:
        return f"{goal} not reached"
    return (
        f"{goal} reached at round {summary.target_round} after "
        f"{_duration(summary.target_elapsed_s, summary.clock_unit)}"
    )


def _at_round(value: float | None, number: int | None) -> str:
    if value is None or number is None:
        return "not measured"
    return f"{value:.4g} (round {number})"


def _duration(seconds: float, unit: str) -> str:
    """``12345.6 simulated seconds (3h 25m 46s)``; the clock form only past a minute."""
    text = f"{seconds:.1f} {unit}"
    if seconds < 60:
        return text
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    clock = f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"
    return f"{text} ({clock})"


def _traffic_table(summary: RunSummary) -> Table:
    table = Table(title="traffic by region")
    for column in ("region", "clients", "bytes up", "bytes down", "MB up", "MB down"):
        table.add_column(column, justify="left" if column == "region" else "right")
    for t in summary.regions:
        table.add_row(escape(t.region), str(t.clients), *_bytes(t.bytes_up, t.bytes_down))
    table.add_row("total", "", *_bytes(summary.bytes_up, summary.bytes_down), style="bold")
    return table


def _bytes(up: int, down: int) -> tuple[str, str, str, str]:
    return str(up), str(down), f"{up / 1e6:.2f}", f"{down / 1e6:.2f}"
