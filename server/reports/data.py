"""What a report shows, read from the database in a few aggregated queries.

Kept apart from the plotting so that it needs no matplotlib and can be tested on its own:
the series (per round), the traffic per region and round, and the clients x rounds grid
of participation outcomes as a small integer matrix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.server.simulation.summary import RunSummary as Outcome
from geofl.server.simulation.summary import metric_value, summarize_run
from geofl.storage import Database, queries
from geofl.storage.exports import NodeCell, NodeLabel, RegionRoundTraffic
from geofl.storage.models import ParticipationStatus
from geofl.storage.records import RoundSummary, RunSummary

__all__ = [
    "GRID_STATES",
    "NOT_ASKED",
    "ReportData",
    "accuracy_series",
    "load_report_data",
    "participation_grid",
]

#: Cell codes of the participation grid, worst last: a cell shows the worst final outcome
#: of the node's tasks in that round (0: the node had no task).
NOT_ASKED = "not asked"
GRID_STATES: tuple[str, ...] = (
    NOT_ASKED,
    ParticipationStatus.OK.value,
    ParticipationStatus.LATE.value,
    ParticipationStatus.DROPPED.value,
    ParticipationStatus.REJECTED.value,
    ParticipationStatus.FAILED.value,
)
_CODE = {state: code for code, state in enumerate(GRID_STATES)}


@dataclass(frozen=True)
class ReportData:
    """Everything a report is drawn from, for one run."""

    run: RunSummary
    config: dict[str, Any]
    rounds: tuple[RoundSummary, ...]
    #: Time-to-accuracy and totals per region (the end-of-run summary of ``simulate``).
    outcome: Outcome
    nodes: tuple[NodeLabel, ...]
    cells: tuple[NodeCell, ...]
    traffic: tuple[RegionRoundTraffic, ...]

    @property
    def last_round(self) -> int:
        """The highest round number the run has a row for (0 before any round)."""
        return max((r.number for r in self.rounds), default=0)

    def traffic_per_round(self) -> npt.NDArray[np.float64]:
        """Bytes ``[round - 1, (up, down, up raw, down raw)]`` over every participation.

        Summed from the participations rather than read from the round rows: a round
        that failed moved bytes too, but only a commit writes the round's totals.
        """
        moved = np.zeros((self.last_round, 4))
        for t in self.traffic:
            moved[t.round_number - 1] += (
                t.bytes_up,
                t.bytes_down,
                t.bytes_up_raw,
                t.bytes_down_raw,
            )
        return moved


def load_report_data(db: Database, run_id: int) -> ReportData:
    """Read run ``run_id``'s report data.

    Raises
    ------
    geofl.storage.RunNotFoundError
        No run has this id.
    """
    with db.session() as session:
        run = queries.run_summary(session, run_id)
        config = dict(queries.get_run(session, run_id).config)
        rounds = tuple(queries.rounds_of(session, run_id))
        nodes = tuple(queries.run_nodes(session, run_id))
        cells = tuple(queries.participation_cells(session, run_id))
        traffic = tuple(queries.region_traffic_by_round(session, run_id))
    return ReportData(run, config, rounds, summarize_run(db, run_id), nodes, cells, traffic)


def participation_grid(
    nodes: Sequence[NodeLabel], cells: Sequence[NodeCell], last_round: int
) -> npt.NDArray[np.int8]:
    """Matrix ``[node row, round - 1]`` of :data:`GRID_STATES` codes, nodes in the given order.

    Each cell holds the worst of the node's final task outcomes in that round, so a client
    that trained but dropped out of secure aggregation's unmasking shows ``dropped``.
    """
    grid = np.zeros((len(nodes), last_round), dtype=np.int8)
    if not cells or last_round == 0:
        return grid
    row_of = {node.id: index for index, node in enumerate(nodes)}
    rows = np.fromiter((row_of[c.node_id] for c in cells), dtype=np.int64, count=len(cells))
    columns = np.fromiter((c.round_number - 1 for c in cells), dtype=np.int64, count=len(cells))
    codes = np.fromiter((_CODE[c.status] for c in cells), dtype=np.int8, count=len(cells))
    np.maximum.at(grid, (rows, columns), codes)
    return grid


def accuracy_series(rounds: Sequence[RoundSummary]) -> dict[str, list[float | None]]:
    """Per accuracy-like metric and source, its value in each round (None: not measured).

    Any metric whose name contains ``acc`` counts (``accuracy``, ``top1_acc``...); sources
    are the server-side evaluation, the federated evaluation and the fit results. Series
    that were never measured are left out.
    """
    sources = (
        ("server", "server_eval_metrics"),
        ("federated", "eval_metrics"),
        ("fit", "fit_metrics"),
    )
    series: dict[str, list[float | None]] = {}
    for label, attribute in sources:
        per_round: list[dict[str, Any]] = [getattr(r, attribute) for r in rounds]
        names = sorted({name for metrics in per_round for name in metrics if "acc" in name.lower()})
        for name in names:
            values = [metric_value(metrics, {}, name) for metrics in per_round]
            if any(v is not None for v in values):
                series[f"{label} {name}"] = values
    return series
