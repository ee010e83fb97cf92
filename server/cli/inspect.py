"""``geofl runs list|show`` and ``geofl db upgrade``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import inspect as inspect_schema
from sqlalchemy.orm import Session

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.offline import database_url, open_recorded_database
from geofl.storage import (
    StorageUnavailableError,
    current_revision,
    queries,
)
from geofl.storage.errors import DatabaseURLError, RunNotFoundError
from geofl.storage.events import EventRecord
from geofl.storage.measurements import NodeMeasurementRecord
from geofl.storage.records import RunDetail, RunSummary

#: The events ``geofl runs show`` lists (rounds have their own table).
SHOWN_EVENTS = ("run.", "security.", "flower.")


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def _metrics(metrics: dict[str, Any]) -> str:
    return (
        " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
            for k, v in sorted(metrics.items())
        )
        or "-"
    )


def runs_table(runs: list[RunSummary]) -> Table:
    """``geofl runs list`` as a table."""
    table = Table(title="runs")
    for column in ("id", "name", "status", "rounds", "nodes", "MB up", "MB down", "created"):
        table.add_column(column)
    for r in runs:
        table.add_row(
            str(r.id),
            r.name,
            r.status,
            f"{r.last_committed_round}/{r.rounds_planned}",
            str(r.num_nodes),
            _mb(r.bytes_up),
            _mb(r.bytes_down),
            r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    return table


def detail_tables(
    detail: RunDetail,
    links: Sequence[NodeMeasurementRecord] = (),
    events: Sequence[EventRecord] = (),
) -> list[Table]:
    """``geofl runs show`` as tables: rounds, traffic by region, links, participations,
    events (the run's lifecycle, security and Flower ones).

    The links and events tables are left out when the run has none.
    """
    run = detail.run
    rounds = Table(
        title=f"run {run.id} '{run.name}': {run.status}"
        + (f" ({run.error})" if run.error else "")
        + (" · simulated clock: times are simulated seconds" if run.simulated_clock else "")
    )
    for column in (
        "round",
        "status",
        "cohort",
        "ok/failed",
        "seconds",
        "MB up (raw)",
        "MB down (raw)",
        "train loss",
        "eval loss",
        *(["ε"] if any(r.epsilon is not None for r in detail.rounds) else []),
        "metrics",
    ):
        rounds.add_column(column)
    for r in detail.rounds:
        metrics = {**r.eval_metrics, **{f"server_{k}": v for k, v in r.server_eval_metrics.items()}}
        rounds.add_row(
            str(r.number),
            r.status + (f": {r.error}" if r.error else ""),
            f"{r.num_selected}/{r.cohort_target}",
            f"{r.num_succeeded}/{r.num_failed}",
            _num(r.duration_s, ".2f"),
            _traffic(r.bytes_up, r.bytes_up_raw),
            _traffic(r.bytes_down, r.bytes_down_raw),
            _num(r.train_loss),
            _num(r.eval_loss),
            *([_num(r.epsilon)] if any(x.epsilon is not None for x in detail.rounds) else []),
            _metrics(metrics),
        )
    clients = Table(title="participations")
    for column in (
        "round",
        "node",
        "region",
        "kind",
        "status",
        "examples",
        "seconds",
        "MB up (raw)",
        "MB down (raw)",
        "reason",
    ):
        clients.add_column(column)
    for p in detail.participations:
        clients.add_row(
            str(p.round_number),
            f"{p.node_id} {p.node_name}",
            p.node_region or "-",
            p.kind,
            p.status,
            str(p.num_examples),
            _num(p.duration_s, ".2f"),
            _traffic(p.bytes_up, p.bytes_up_raw),
            _traffic(p.bytes_down, p.bytes_down_raw),
            p.reason or "",
        )
    measured = [links_table(links)] if links else []
    shown = [e for e in events if e.kind.startswith(SHOWN_EVENTS)]
    logged = [events_table(shown)] if shown else []
    return [rounds, regions_table(detail), *measured, clients, *logged]


def events_table(events: Sequence[EventRecord]) -> Table:
    """A run's events, oldest first."""
    table = Table(title="events")
    for column in ("id", "time", "round", "kind", "message"):
        table.add_column(column)
    for e in events:
        table.add_row(
            str(e.id),
            e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            "-" if e.round is None else str(e.round),
            e.kind,
            e.message,
        )
    return table


def event_line(event: EventRecord) -> str:
    """One event as ``geofl runs logs`` prints it."""
    where = "" if event.round is None else f" round {event.round}"
    return f"{event.created_at.isoformat(timespec='seconds')} {event.kind}{where}: {event.message}"


def regions_table(detail: RunDetail) -> Table:
    """Traffic per region over the whole run: wire bytes, and what they would have been."""
    totals: dict[str, list[int]] = {}
    nodes: dict[str, set[int]] = {}
    for p in detail.participations:
        region = p.node_region or "-"
        row = totals.setdefault(region, [0, 0, 0, 0])
        row[0] += p.bytes_up
        row[1] += p.bytes_up_raw
        row[2] += p.bytes_down
        row[3] += p.bytes_down_raw
        nodes.setdefault(region, set()).add(p.node_id)
    table = Table(title="traffic by region")
    for column in ("region", "clients", "MB up", "MB up raw", "MB down", "MB down raw"):
        table.add_column(column)
    for region, (up, up_raw, down, down_raw) in sorted(totals.items()):
        table.add_row(
            region, str(len(nodes[region])), _mb(up), _mb(up_raw), _mb(down), _mb(down_raw)
        )
    return table


def links_table(links: Sequence[NodeMeasurementRecord]) -> Table:
    """What the server measured of each node, as of the newest round it was measured in."""
    table = Table(title="links (measured)")
    for column in (
        "node",
        "region",
        "round",
        "RTT ms",
        "down Mbit/s",
        "up Mbit/s",
        "samples/s",
        "availability",
        "tasks",
    ):
        table.add_column(column)
    for m in links:
        table.add_row(
            f"{m.node_id} {m.node_name}",
            m.node_region or "-",
            str(m.round_number),
            _num(None if m.rtt_s is None else m.rtt_s * 1e3, ".1f"),
            _num(None if m.down_bps is None else m.down_bps / 1e6, ".2f"),
            _num(None if m.up_bps is None else m.up_bps / 1e6, ".2f"),
            _num(m.samples_per_s, ".1f"),
            _num(m.availability, ".2f"),
            str(m.observations),
        )
    return table


def _measured_links(session: Session, run_id: int) -> list[NodeMeasurementRecord]:
    """The run's newest link measurements; none in a database that predates them."""
    if not inspect_schema(session.connection()).has_table("node_measurements"):
        return []
    return queries.latest_measurements(session, run_id)


def _traffic(wire: int, raw: int) -> str:
    """``wire`` MB, with the uncompressed figure when compression changed it."""
    return _mb(wire) if wire == raw else f"{_mb(wire)} ({_mb(raw)})"


def run_inspect(args: argparse.Namespace) -> int:
    """Dispatch ``runs`` and ``db`` actions; returns the exit code."""
    # Wide enough for the tables when the output is not a terminal (pipes, CI logs).
    console = Console(width=None if sys.stdout.isatty() else 200)
    url = database_url(args.db)
    try:
        if args.command == "db":
            from geofl.storage import upgrade

            upgrade(url)
            console.print(f"database at revision {current_revision(url)}")
            return ExitCode.OK
        with open_recorded_database(url) as db, db.session() as session:
            if args.runs_command == "list":
                runs = queries.list_runs(session)
                if args.json:
                    print(json.dumps([r.to_dict() for r in runs], indent=2))
                else:
                    console.print(runs_table(runs))
                return ExitCode.OK
            detail = queries.run_detail(session, args.run_id)
            links = _measured_links(session, args.run_id)
            events = queries.events_of(session, args.run_id)
    except (StorageUnavailableError, DatabaseURLError) as exc:
        print(f"geofl: error: {exc}", file=sys.stderr)
        return ExitCode.STORAGE_UNAVAILABLE
    except RunNotFoundError as exc:
        print(f"geofl: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    if args.json:
        shown = {
            **detail.to_dict(),
            "links": [m.to_dict() for m in links],
            "events": [e.to_dict() for e in events],
        }
        print(json.dumps(shown, indent=2))
    else:
        for table in detail_tables(detail, links, events):
            console.print(table)
    return ExitCode.OK


__all__ = [
    "SHOWN_EVENTS",
    "detail_tables",
    "event_line",
    "events_table",
    "links_table",
    "run_inspect",
    "runs_table",
]
