"""``geofl runs report`` and ``geofl runs export`` on the database of a real run.

The run is the real coordinator on the virtual clock with eight simulated clients in two
regions: the far region misses the deadline (``late``), one near client sends NaN
(``rejected``), and a round fails, so the report and the CSV files have every kind of
row to get right. Values are checked against the database rows, read independently.
"""

from __future__ import annotations

import base64
import csv
import io
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.main import main
from geofl.server.reports.plots import GRID_COLOURS
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage.models import Node, Participation, Round, Run
from tests.integration.conftest import APPS, run_config, run_rows

REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}
PLOTS = ("accuracy", "loss", "time", "bytes", "regions", "participation")
#: Worst last, as the map combines a node's outcomes in a round.
SEVERITY = ("not asked", "ok", "late", "dropped", "rejected", "failed")


@dataclass
class RecordedRun:
    url: str
    run: Run
    rounds: list[Round]
    pairs: list[tuple[Participation, Node]]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RecordedRun]:
    tmp_path = tmp_path_factory.mktemp("run")
    config = run_config(
        tmp_path,
        run={"name": "report-e2e", "rounds": 4, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 6, "min_clients": 2},
        schedule={"deadline_s": 0.15, "wait_for_clients_s": 5},
        simulation={
            "clients": 8,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
            "regions": REGIONS,
            "compute": {"samples_per_s": 1000.0},
            "node_config": {"nan-ids": "1"},
        },
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(APPS))
        run_virtual_simulation(config)
    run, rounds, pairs = run_rows(config)
    yield RecordedRun(config.storage.url, run, rounds, pairs)


def _cli(*argv: str) -> int:
    return main(["runs", *argv])


def test_the_run_has_every_kind_of_row(recorded: RecordedRun) -> None:
    """Guard for the tests below: the scenario gives what they check."""
    statuses = {p.status for p, _ in recorded.pairs}
    assert {"ok", "late", "rejected"} <= statuses
    assert {r.status for r in recorded.rounds} == {"committed", "failed"}


def _figures(page: str) -> dict[str, str]:
    found = {}
    for plot in PLOTS:
        start = page.index(f'<figure id="plot-{plot}">')
        found[plot] = page[start : page.index("</figure>", start)]
    return found


def _grid_image(figure: str) -> np.ndarray:
    encoded = re.search(r'xlink:href="data:image/png;base64,([^"]+)"', figure)
    assert encoded is not None, "the participation map is embedded as a PNG"
    png = base64.b64decode("".join(encoded.group(1).split()))
    pixels: np.ndarray = matplotlib.image.imread(io.BytesIO(png), format="png")
    return (pixels[:, :, :3] * 255).round().astype(int)


def _expected_map(recorded: RecordedRun) -> dict[tuple[str, int], str]:
    """(node name, round) -> worst status among each task's last attempt, from the rows."""
    number = {r.id: r.number for r in recorded.rounds}
    last: dict[tuple[int, int], tuple[int, str, str]] = {}
    for p, node in recorded.pairs:
        key = (p.round_id, p.task_id)
        if key not in last or p.attempt > last[key][0]:
            last[key] = (p.attempt, p.status, node.name)
    cells: dict[tuple[str, int], str] = {}
    for (round_id, _), (_, status, name) in last.items():
        cell = (name, number[round_id])
        if SEVERITY.index(status) > SEVERITY.index(cells.get(cell, "not asked")):
            cells[cell] = status
    return cells


def _colour(hex_colour: str) -> list[int]:
    return [int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)]


def test_report_holds_every_plot_and_fetches_nothing(
    recorded: RecordedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    code = _cli("report", str(recorded.run.id), "--db", recorded.url, "--out", str(out))
    assert code == ExitCode.OK
    assert f"wrote {out / 'report.html'}" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["report.html"]
    page = (out / "report.html").read_text(encoding="utf-8")
    figures = _figures(page)
    assert all("<svg" in figure for figure in figures.values())
    # Self-contained: no scripts, stylesheets or images loaded from anywhere.
    assert not re.search(r"<script|<link|<img|<iframe|url\((?!#)", page)
    assert not re.search(r'(?:src|href)="(?!data:|#)', page)
    assert "geofl run 1 &#x27;report-e2e&#x27;" in page
    committed = sum(r.status == "committed" for r in recorded.rounds)
    assert f"{committed} committed, 1 failed of 4 planned" in page
    for label in ("late", "rejected", "ok"):
        assert f">{label}<" in figures["participation"]  # legend entries, as text


def test_participation_map_matches_the_database(recorded: RecordedRun, tmp_path: Path) -> None:
    out = tmp_path / "report"
    assert _cli("report", str(recorded.run.id), "--db", recorded.url, "--out", str(out)) == 0
    pixels = _grid_image(_figures((out / "report.html").read_text())["participation"])
    regions = {n.name: n.region for _, n in recorded.pairs}
    # Rows: by region, then name; one pixel per (client, round).
    rows = sorted(regions, key=lambda name: (regions[name] or "", name))
    assert pixels.shape[:2] == (len(rows), len(recorded.rounds))
    expected = _expected_map(recorded)
    for y, name in enumerate(rows):
        for x in range(len(recorded.rounds)):
            status = expected.get((name, x + 1), "not asked")
            assert pixels[y, x].tolist() == _colour(GRID_COLOURS[status]), (name, x + 1, status)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_export_reads_back_as_the_database(
    recorded: RecordedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "csv"
    assert _cli("export", str(recorded.run.id), "--db", recorded.url, "--csv", str(out)) == 0
    assert "participations)" in capsys.readouterr().out
    rounds = _read(out / "rounds.csv")
    assert len(rounds) == len(recorded.rounds)
    for row, stored in zip(rounds, recorded.rounds, strict=True):
        assert int(row["round"]) == stored.number and row["status"] == stored.status
        assert float(row["duration_s"]) == stored.duration_s
        assert int(row["bytes_down"]) == stored.bytes_down
        assert int(row["num_succeeded"]) == stored.num_succeeded
        assert row["error"] == (stored.error or "")
        for name, value in stored.server_eval_metrics.items():
            assert float(row[f"server_eval_metrics.{name}"]) == value
    by_key = {(p.round_id, p.task_id, p.attempt): (p, n) for p, n in recorded.pairs}
    round_id = {r.number: r.id for r in recorded.rounds}
    rows = _read(out / "participations.csv")
    assert len(rows) == len(by_key)
    for row in rows:
        key = (round_id[int(row["round"])], int(row["task_id"]), int(row["attempt"]))
        p, node = by_key[key]
        assert (row["node_name"], row["node_region"]) == (node.name, node.region)
        assert (row["kind"], row["status"], row["reason"]) == (p.kind, p.status, p.reason or "")
        assert (int(row["bytes_up"]), int(row["bytes_down"])) == (p.bytes_up, p.bytes_down)
        assert (float(row["duration_s"]) if row["duration_s"] else None) == p.duration_s


def test_unknown_run_id_is_a_usage_error(
    recorded: RecordedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for action, flag in (("report", "--out"), ("export", "--csv")):
        out = tmp_path / action
        assert _cli(action, "99", "--db", recorded.url, flag, str(out)) == ExitCode.USAGE
        assert "run 99 does not exist" in capsys.readouterr().err
        assert not out.exists()


def test_missing_database_is_storage_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere.db"
    for action, flag in (("report", "--out"), ("export", "--csv")):
        code = _cli(action, "1", "--db", f"sqlite:///{missing}", flag, str(tmp_path / action))
        assert code == ExitCode.STORAGE_UNAVAILABLE
        assert f"no database file at {missing}" in capsys.readouterr().err
    assert not missing.exists()  # reading created no empty database


def test_database_without_schema_is_storage_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    code = _cli("export", "1", "--db", f"sqlite:///{empty}", "--csv", str(tmp_path / "csv"))
    assert code == ExitCode.STORAGE_UNAVAILABLE
    assert "holds no geofl schema" in capsys.readouterr().err


def test_output_in_the_way_is_refused_and_left_alone(
    recorded: RecordedRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    a_file = tmp_path / "file"
    a_file.write_text("mine too")
    for action, flag in (("report", "--out"), ("export", "--csv")):
        args = (action, str(recorded.run.id), "--db", recorded.url, flag)
        assert _cli(*args, str(busy)) == ExitCode.USAGE
        assert f"output folder {busy} is not empty" in capsys.readouterr().err
        assert _cli(*args, str(a_file)) == ExitCode.USAGE
        assert "is not a folder" in capsys.readouterr().err
    assert sorted(p.name for p in busy.iterdir()) == ["keep.txt"]
    assert (busy / "keep.txt").read_text() == "mine" and a_file.read_text() == "mine too"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli("export", str(recorded.run.id), "--db", recorded.url, "--csv", str(empty)) == 0


def test_report_without_matplotlib_says_how_to_install_it(
    recorded: RecordedRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    out = tmp_path / "report"
    assert _cli("report", str(recorded.run.id), "--db", recorded.url, "--out", str(out)) == 2
    assert "pip install 'geofl[report]'" in capsys.readouterr().err
    assert not out.exists()
    # The CSV export needs no extra.
    assert _cli("export", str(recorded.run.id), "--db", recorded.url, "--csv", str(out)) == 0
