"""The report's plots, drawn with matplotlib and returned as inline SVG text.

matplotlib is optional (the ``geofl[report]`` extra): :func:`require_matplotlib` says how
to install it. Figures are made with :class:`matplotlib.figure.Figure` directly, never
pyplot, so no global figure state or GUI backend is involved. Text stays text in the SVG
(``svg.fonttype: none``), which keeps files small and searchable, and each figure gets
its own ``svg.hashsalt`` so the ids of several SVGs in one page never collide. The
clients x rounds grid is a raster (one pixel per cell, embedded in its SVG as PNG and
drawn pixelated): 1,000 clients x 500 rounds as vector rectangles would be half a
million elements.
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from geofl.server.reports.data import (
    GRID_STATES,
    ReportData,
    accuracy_series,
    participation_grid,
)
from geofl.server.reports.errors import ReportError
from geofl.server.simulation.summary import NO_REGION

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INSTALL_HINT", "Plot", "render_plots", "require_matplotlib"]

INSTALL_HINT = "pip install 'geofl[report]'"
#: Above this many clients the grid is labelled by region, not by client name.
NAMED_ROWS_MAX = 40
#: Up to this many rounds, per-round stacks are bars; beyond, a stacked area.
BARS_MAX = 100
GRID_COLOURS = {
    "not asked": "#f2f2f2",
    "ok": "#2ca02c",
    "late": "#ffbf00",
    "dropped": "#7f7f7f",
    "rejected": "#9467bd",
    "failed": "#d62728",
}
_WIDTH = 10.0
_MB = 1e6


@dataclass(frozen=True)
class Plot:
    """One figure of the report."""

    id: str
    title: str
    svg: str


def require_matplotlib() -> None:
    """Fail early, with the fix, when matplotlib is not installed.

    Raises
    ------
    ReportError
        matplotlib cannot be imported.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ReportError(
            f"the HTML report draws its plots with matplotlib, which is not installed: "
            f"{INSTALL_HINT} (or `geofl runs export RUN --csv DIR` needs no extra)"
        ) from exc


@contextmanager
def _figure(name: str, height: float, columns: int = 1) -> Iterator[tuple[Figure, list[Axes]]]:
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    with rc_context({"svg.fonttype": "none", "svg.hashsalt": f"geofl-{name}", "font.size": 9}):
        figure = Figure(figsize=(_WIDTH, height), layout="constrained")
        axes = list(figure.subplots(1, columns, squeeze=False)[0])
        yield figure, axes


def _svg(figure: Figure) -> str:
    """The figure as SVG text; call it inside :func:`_figure` (its settings apply)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE


def _nothing(axes: Axes, what: str) -> None:
    axes.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=axes.transAxes)
    axes.set_xticks([])
    axes.set_yticks([])


def _line(axes: Axes, xs: Sequence[float], ys: Sequence[float | None], label: str) -> None:
    """A line through the measured points (None: skipped), dots when there are few."""
    points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
    if not points:
        return
    px, py = zip(*points, strict=True)
    axes.plot(px, py, marker="o" if len(points) <= 60 else None, markersize=3, label=label)


def _round_axis(axes: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("round")


def _stack(
    axes: Axes, numbers: Sequence[float], stacks: Sequence[Sequence[float]], labels: Sequence[str]
) -> None:
    """Stacked bars per round; a stacked area past :data:`BARS_MAX` rounds (smaller SVG)."""
    if len(numbers) > BARS_MAX:
        axes.stackplot(numbers, *stacks, labels=labels, step="mid", alpha=0.85)
        return
    bottom = np.zeros(len(numbers))
    for values, label in zip(stacks, labels, strict=True):
        axes.bar(numbers, values, width=0.8, bottom=bottom, label=label, alpha=0.85)
        bottom += np.asarray(values, dtype=float)


def _accuracy(data: ReportData) -> Plot:
    rounds = data.rounds
    numbers = [float(r.number) for r in rounds]
    elapsed = {p.number: p.elapsed_s for p in data.outcome.rounds}
    moved = data.traffic_per_round()
    cumulative = np.cumsum([moved[r.number - 1, 0] + moved[r.number - 1, 1] for r in rounds]) / _MB
    series = accuracy_series(rounds)
    with _figure("accuracy", 3.4, columns=3) as (figure, (by_round, by_time, by_bytes)):
        if not series:
            for axes in (by_round, by_time, by_bytes):
                _nothing(axes, "accuracy")
        for label, values in series.items():
            timed = [
                (elapsed[r.number], v)
                for r, v in zip(rounds, values, strict=True)
                if r.number in elapsed
            ]
            _line(by_round, numbers, values, label)
            if timed:
                _line(by_time, [t for t, _ in timed], [v for _, v in timed], label)
            _line(by_bytes, list(cumulative), values, label)
        if series:
            _round_axis(by_round)
        by_time.set_xlabel(data.outcome.clock_unit + " since the run started")
        by_bytes.set_xlabel("cumulative traffic, up + down (MB)")
        by_round.set_ylabel("accuracy")
        if series:
            by_round.legend(fontsize=7)
        for axes in (by_round, by_time, by_bytes):
            axes.grid(True, alpha=0.3)
        return Plot("accuracy", "Accuracy against round, time and traffic", _svg(figure))


def _loss(data: ReportData) -> Plot:
    rounds = data.rounds
    numbers = [float(r.number) for r in rounds]
    series = {
        "train loss": [r.train_loss for r in rounds],
        "federated evaluation loss": [r.eval_loss for r in rounds],
        "server evaluation loss": [r.server_eval_loss for r in rounds],
    }
    measured = {k: v for k, v in series.items() if any(x is not None for x in v)}
    with _figure("loss", 3.2) as (figure, (axes,)):
        if not measured:
            _nothing(axes, "loss")
        for label, values in measured.items():
            _line(axes, numbers, values, label)
        if measured:
            axes.legend(fontsize=7)
            _round_axis(axes)
            axes.set_ylabel("loss")
            axes.grid(True, alpha=0.3)
        return Plot("loss", "Loss against round", _svg(figure))


def _time(data: ReportData) -> Plot:
    rounds = data.rounds
    numbers = np.array([r.number for r in rounds], dtype=float)
    phases = list(dict.fromkeys(p for r in rounds for p in r.phase_durations))
    with _figure("time", 3.2) as (figure, (axes,)):
        if not rounds:
            _nothing(axes, "round")
            return Plot("time", "Time per round", _svg(figure))
        if phases:
            stacks = [[float(r.phase_durations.get(p, 0.0)) for r in rounds] for p in phases]
            _stack(axes, list(numbers), stacks, phases)
        durations = [r.duration_s for r in rounds]
        _line(axes, list(numbers), durations, "round duration")
        _round_axis(axes)
        axes.set_ylabel(data.outcome.clock_unit)
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes.grid(True, alpha=0.3)
        return Plot("time", "Time per round, by phase", _svg(figure))


def _bytes(data: ReportData) -> Plot:
    moved = data.traffic_per_round() / _MB
    numbers = [float(n) for n in range(1, data.last_round + 1)]
    with _figure("bytes", 3.2) as (figure, (axes,)):
        if not numbers:
            _nothing(axes, "round")
            return Plot("bytes", "Traffic per round", _svg(figure))
        for label, wire, raw in (
            ("up (clients to server)", 0, 2),
            ("down (server to clients)", 1, 3),
        ):
            values = moved[:, wire].tolist()
            _line(axes, numbers, values, label)
            if not np.array_equal(moved[:, raw], moved[:, wire]):
                axes.plot(numbers, moved[:, raw], linestyle="--", label=f"{label}, uncompressed")
        _round_axis(axes)
        axes.set_ylabel("MB")
        axes.legend(fontsize=7)
        axes.grid(True, alpha=0.3)
        return Plot("bytes", "Traffic per round", _svg(figure))


def _regions(data: ReportData) -> Plot:
    totals = data.outcome.regions
    with _figure("regions", 3.4, columns=2) as (figure, (bars, per_round)):
        if not totals:
            _nothing(bars, "traffic")
            _nothing(per_round, "traffic")
            return Plot("regions", "Traffic per region", _svg(figure))
        names = [t.region for t in totals]
        ys = np.arange(len(names))
        bars.barh(ys - 0.2, [t.bytes_up / _MB for t in totals], height=0.4, label="up")
        bars.barh(ys + 0.2, [t.bytes_down / _MB for t in totals], height=0.4, label="down")
        bars.set_yticks(ys, [f"{t.region} ({t.clients})" for t in totals])
        bars.invert_yaxis()
        bars.set_xlabel("MB over the run (clients in parentheses)")
        bars.legend(fontsize=7)
        _region_stack(per_round, data, names)
        for axes in (bars, per_round):
            axes.grid(True, alpha=0.3)
        return Plot("regions", "Traffic per region", _svg(figure))


def _region_stack(axes: Axes, data: ReportData, names: list[str]) -> None:
    numbers = list(range(1, data.last_round + 1))
    index = {name: i for i, name in enumerate(names)}
    stacks = np.zeros((len(names), len(numbers)))
    for t in data.traffic:
        stacks[index[t.region or NO_REGION], t.round_number - 1] += (
            t.bytes_up + t.bytes_down
        ) / _MB
    _stack(axes, [float(n) for n in numbers], stacks.tolist(), names)
    _round_axis(axes)
    axes.set_ylabel("MB up + down per round")
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _participation(data: ReportData) -> Plot:
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    nodes = data.nodes
    grid = participation_grid(nodes, data.cells, data.last_round)
    height = min(9.0, 1.6 + 0.16 * len(nodes)) if len(nodes) <= NAMED_ROWS_MAX else 6.0
    with _figure("participation", height) as (figure, (axes,)):
        if grid.size == 0:
            _nothing(axes, "participation")
            return Plot("participation", "Participation: clients x rounds", _svg(figure))
        colours = ListedColormap([GRID_COLOURS[s] for s in GRID_STATES])
        norm = BoundaryNorm(np.arange(len(GRID_STATES) + 1) - 0.5, len(GRID_STATES))
        axes.imshow(
            grid,
            cmap=colours,
            norm=norm,
            aspect="auto",
            interpolation="none",
            extent=(0.5, data.last_round + 0.5, len(nodes) - 0.5, -0.5),
        )
        _label_rows(axes, data)
        _round_axis(axes)
        present = sorted(set(np.unique(grid).tolist()))
        handles = [Patch(color=GRID_COLOURS[GRID_STATES[c]], label=GRID_STATES[c]) for c in present]
        axes.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        return Plot("participation", "Participation: clients x rounds", _svg(figure))


def _label_rows(axes: Axes, data: ReportData) -> None:
    """Client names when they fit, else one label per region (rows are grouped by region)."""
    nodes = data.nodes
    if len(nodes) <= NAMED_ROWS_MAX:
        names = [n.name + (f" ({n.region})" if n.region else "") for n in nodes]
        axes.set_yticks(range(len(nodes)), names, fontsize=7)
        axes.set_ylabel("client")
        return
    spans: dict[str, list[int]] = {}
    for row, node in enumerate(nodes):
        spans.setdefault(node.region or NO_REGION, []).append(row)
    axes.set_yticks([(rows[0] + rows[-1]) / 2 for rows in spans.values()], list(spans))
    for rows in list(spans.values())[1:]:
        axes.axhline(rows[0] - 0.5, color="black", linewidth=0.6)
    axes.set_ylabel(f"{len(nodes)} clients, by region")


def render_plots(data: ReportData) -> list[Plot]:
    """Every plot of the report, in page order.

    Raises
    ------
    ReportError
        matplotlib is not installed.
    """
    require_matplotlib()
    drawers: tuple[Any, ...] = (_accuracy, _loss, _time, _bytes, _regions, _participation)
    return [draw(data) for draw in drawers]
