"""The report page: one self-contained HTML file (inline CSS and SVG, nothing fetched).

Every value that comes from the run (names, regions, errors, the configuration) is
escaped; the SVG comes from matplotlib, which escapes its own text.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

import yaml

from geofl.server.reports.data import ReportData
from geofl.server.reports.plots import Plot
from geofl.server.simulation.summary import RunSummary as Outcome

__all__ = ["render_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 0.5em 0 1.5em 0; } figure svg { width: 100%; height: auto; }
figcaption { font-weight: 600; margin-bottom: 0.3em; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.error { color: #b00; }
"""


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f}"


def _at(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _measured(value: float | None, number: int | None) -> str:
    return "not measured" if value is None or number is None else f"{value:.4g} (round {number})"


def _rows(pairs: Sequence[tuple[str, str]]) -> str:
    return "\n".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in pairs)


def _summary(data: ReportData) -> str:
    run, outcome = data.run, data.outcome
    traffic = f"{_mb(run.bytes_up)} MB up, {_mb(run.bytes_down)} MB down"
    if (run.bytes_up_raw, run.bytes_down_raw) != (run.bytes_up, run.bytes_down):
        traffic += (
            f" (uncompressed: {_mb(run.bytes_up_raw)} MB up, {_mb(run.bytes_down_raw)} MB down)"
        )
    pairs = [
        ("status", run.status + (f": {run.error}" if run.error else "")),
        ("clock", outcome.clock_unit),
        ("created", _at(run.created_at)),
        ("finished", _at(run.finished_at)),
        (
            "rounds",
            f"{outcome.rounds_committed} committed, {outcome.rounds_failed} failed "
            f"of {run.rounds_planned} planned",
        ),
        ("total time", f"{outcome.total_s:,.1f} {outcome.clock_unit}"),
        ("clients", str(run.num_nodes)),
        (f"best {outcome.metric}", _measured(outcome.best_metric, outcome.best_round)),
        (f"final {outcome.metric}", _measured(outcome.final_metric, outcome.final_round)),
        ("traffic", traffic),
        ("config sha256", run.config_sha256),
    ]
    return f'<table id="summary">\n{_rows(pairs)}\n</table>'


def _regions(outcome: Outcome) -> str:
    head = "<tr><th>region</th><th>clients</th><th>MB up</th><th>MB down</th></tr>"
    body = "\n".join(
        f'<tr><td>{escape(t.region)}</td><td class="n">{t.clients}</td>'
        f'<td class="n">{_mb(t.bytes_up)}</td><td class="n">{_mb(t.bytes_down)}</td></tr>'
        for t in outcome.regions
    )
    return f'<table id="regions">\n{head}\n{body}\n</table>'


def _figure(plot: Plot) -> str:
    return (
        f'<figure id="plot-{plot.id}">\n<figcaption>{escape(plot.title)}</figcaption>\n'
        f"{plot.svg}\n</figure>"
    )


def _failed_rounds(data: ReportData) -> str:
    failed = [r for r in data.rounds if r.error]
    if not failed:
        return ""
    items = "\n".join(
        f'<li class="error">round {r.number} ({escape(r.status)}): {escape(r.error or "")}</li>'
        for r in failed
    )
    return f"<h2>Rounds that did not commit</h2>\n<ul>\n{items}\n</ul>"


def render_html(data: ReportData, plots: Sequence[Plot], generated_at: datetime) -> str:
    """The whole page for ``data`` with ``plots`` in order."""
    run = data.run
    title = f"geofl run {run.id} '{run.name}'"
    config = yaml.safe_dump(data.config, sort_keys=True, allow_unicode=True)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">\n<head>\n<meta charset="utf-8">',
        f"<title>{escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>",
        f"<h1>{escape(title)}</h1>",
        f"<p>Report generated {_at(generated_at)} by <code>geofl runs report</code>.</p>",
        "<h2>Summary</h2>",
        _summary(data),
        "<h2>Plots</h2>",
        *(_figure(plot) for plot in plots),
        "<h2>Traffic by region</h2>",
        _regions(data.outcome),
        _failed_rounds(data),
        "<h2>Configuration</h2>",
        f'<pre id="config">{escape(config)}</pre>',
        "</body>\n</html>\n",
    ]
    return "\n".join(part for part in parts if part)
