"""Pieces of ``geofl runs report|export`` that need no database: cells, folders, docs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from geofl.server.reports import ReportError
from geofl.server.reports.csv_export import FILES, cell, columns_markdown
from geofl.server.reports.data import GRID_STATES, participation_grid
from geofl.server.reports.output import prepare_output_folder
from geofl.server.reports.plots import GRID_COLOURS
from geofl.storage.exports import NodeCell, NodeLabel
from geofl.storage.models import ParticipationStatus

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reports.md"


def test_docs_list_every_csv_column_as_the_code_does() -> None:
    assert columns_markdown() in DOCS.read_text(encoding="utf-8")
    for _, columns, _ in FILES:
        names = [c.name for c in columns]
        assert len(names) == len(set(names))


def test_cells_are_plain_text() -> None:
    when = datetime(2025, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    assert cell(None) == "" and cell(True) == "true" and cell(False) == "false"
    assert cell(0.1) == "0.1" and float(cell(1 / 3)) == 1 / 3 and cell(7) == "7"
    assert cell(when) == "2025-01-02T03:04:05.000006+00:00"
    assert cell({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert cell("a,b") == "a,b"  # quoting is the csv writer's job
    assert datetime.fromisoformat(cell(when.astimezone(timezone(timedelta(hours=2))))) == when


def test_every_outcome_has_a_colour_and_a_rank() -> None:
    assert set(GRID_STATES) == {s.value for s in ParticipationStatus} | {"not asked"}
    assert set(GRID_COLOURS) == set(GRID_STATES)


def test_grid_keeps_the_worst_outcome_per_cell() -> None:
    nodes = [NodeLabel(7, "x", "eu"), NodeLabel(3, "y", None)]
    cells = [
        NodeCell(1, 7, "ok"),
        NodeCell(1, 7, "dropped"),
        NodeCell(2, 3, "late"),
        NodeCell(2, 3, "ok"),
        NodeCell(3, 7, "failed"),
    ]
    grid = participation_grid(nodes, cells, 3)
    assert [[GRID_STATES[c] for c in row] for row in grid.tolist()] == [
        ["dropped", "not asked", "failed"],
        ["not asked", "late", "not asked"],
    ]
    assert participation_grid(nodes, [], 0).shape == (2, 0)


def test_output_folder_new_or_empty_only(tmp_path: Path) -> None:
    made = prepare_output_folder(tmp_path / "a" / "b")
    assert made.is_dir()
    assert prepare_output_folder(made) == made  # empty: fine
    (made / "x").write_text("x")
    with pytest.raises(ReportError, match="is not empty"):
        prepare_output_folder(made)
    with pytest.raises(ReportError, match="is not a folder"):
        prepare_output_folder(made / "x")
