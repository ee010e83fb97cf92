"""``geofl runs report RUN --out DIR`` and ``geofl runs export RUN --csv DIR``.

Both read a recorded run's database offline (``--db URL``, as ``runs list|show``) and
exit with the codes of :mod:`geofl.server.cli.exit_codes`: 3 when the database is
missing or unreachable, 2 for an unknown run id, an output folder in the way or the
report's missing plotting extra.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Protocol

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.offline import DEFAULT_DB, database_url, open_recorded_database
from geofl.storage.errors import DatabaseURLError, RunNotFoundError, StorageUnavailableError

__all__ = ["COMMANDS", "Subcommands", "add_arguments", "run_reports"]

#: The ``runs`` actions this module serves.
COMMANDS = ("report", "export")


class Subcommands(Protocol):
    """What ``ArgumentParser.add_subparsers()`` returns, as far as this module uses it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        """A new subcommand parser."""
        ...


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_id", type=int, metavar="RUN_ID", help="the run's id (see `geofl runs list`)"
    )
    parser.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help=f"database URL (default: $GEOFL_DB or {DEFAULT_DB})",
    )


def add_arguments(runs_sub: Subcommands) -> None:
    """Add ``report`` and ``export`` to the ``geofl runs`` subcommands."""
    report = runs_sub.add_parser(
        "report",
        help="an HTML report of a run, with plots (needs geofl[report])",
        description="Write DIR/report.html: one self-contained page (inline SVG) with "
        "accuracy and loss against round, time and traffic, time and bytes per round, "
        "traffic per region, the clients x rounds participation map, the run's summary and "
        "configuration. DIR must be new or empty. Needs matplotlib: pip install 'geofl[report]'.",
    )
    _add_common(report)
    report.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="folder to write report.html to"
    )
    export = runs_sub.add_parser(
        "export",
        help="a run's rounds and participations as CSV",
        description="Write DIR/rounds.csv and DIR/participations.csv (columns: "
        "docs/reports.md). DIR must be new or empty.",
    )
    _add_common(export)
    export.add_argument(
        "--csv",
        type=Path,
        required=True,
        metavar="DIR",
        help="folder to write rounds.csv and participations.csv to",
    )


def _error(message: object) -> None:
    print(f"geofl: error: {message}", file=sys.stderr)


def run_reports(args: argparse.Namespace) -> int:
    """Run ``runs report`` or ``runs export``; returns the exit code."""
    from geofl.server.reports import ReportError, export_csv, write_report

    try:
        with open_recorded_database(database_url(args.db)) as db:
            if args.runs_command == "report":
                path = write_report(db, args.run_id, args.out)
                print(f"wrote {path}")
                return ExitCode.OK
            result = export_csv(db, args.run_id, args.csv)
    except (StorageUnavailableError, DatabaseURLError) as exc:
        _error(exc)
        return ExitCode.STORAGE_UNAVAILABLE
    except (RunNotFoundError, ReportError) as exc:
        _error(exc)
        return ExitCode.USAGE
    print(f"wrote {result.rounds_csv} ({result.rounds} rounds)")
    print(f"wrote {result.participations_csv} ({result.participations} participations)")
    return ExitCode.OK
