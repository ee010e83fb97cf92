"""``geofl runs report RUN --out DIR``: write a run's HTML report."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from geofl.server.reports.data import load_report_data
from geofl.server.reports.html import render_html
from geofl.server.reports.output import check_output_folder, prepare_output_folder
from geofl.server.reports.plots import render_plots, require_matplotlib
from geofl.storage import Database

__all__ = ["REPORT_FILE", "write_report"]

REPORT_FILE = "report.html"


def write_report(db: Database, run_id: int, folder: Path, *, now: datetime | None = None) -> Path:
    """Write ``folder/report.html`` for run ``run_id``; returns its path.

    matplotlib, the run and the folder are checked before anything is drawn or made, so
    a missing extra, a wrong id or a folder in the way leaves nothing behind.

    Raises
    ------
    ReportError
        matplotlib is not installed, or ``folder`` exists and is not an empty folder.
    geofl.storage.RunNotFoundError
        No run has this id.
    """
    require_matplotlib()
    data = load_report_data(db, run_id)
    check_output_folder(folder)  # before the (for a big run, seconds of) drawing
    page = render_html(data, render_plots(data), now or datetime.now(UTC))
    path = prepare_output_folder(folder) / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path
