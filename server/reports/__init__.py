"""Offline reports of a recorded run: an HTML page with plots, and CSV export.

``geofl runs report RUN --out DIR`` writes one self-contained ``report.html`` (inline SVG,
needs the ``geofl[report]`` extra for matplotlib); ``geofl runs export RUN --csv DIR``
writes ``rounds.csv`` and ``participations.csv`` (no extra needed). Both read only the
database. See ``docs/reports.md``.
"""

from geofl.server.reports.csv_export import ExportResult, export_csv
from geofl.server.reports.errors import ReportError
from geofl.server.reports.report import REPORT_FILE, write_report

__all__ = ["REPORT_FILE", "ExportResult", "ReportError", "export_csv", "write_report"]
