"""The report and export queries, and the CSV/HTML built on them, on every backend.

One run is built through the storage API with everything the queries must get right:
three regions (one node without a region), a retried task (attempt 1 failed, attempt 2
ok), a node whose fit succeeded but whose evaluation failed, a failed round, compressed
traffic (raw > wire), and per-client metrics. Every expected value below is worked out
by hand from the rows written here.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from geofl.server.reports import export_csv, write_report
from geofl.server.reports.data import GRID_STATES, load_report_data, participation_grid
from geofl.storage import Database, RunNotFoundError, queries

T0 = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
CONFIG = {"run": {"name": "exported", "rounds": 3}}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def run(database: Database) -> Iterator[tuple[int, dict[str, int]]]:
    with database.session() as session:
        run_id = queries.create_run(session, "exported", CONFIG, 3, True, now=T0).id
        nodes = {
            name: queries.upsert_node(session, run_id, name, region, now=T0).id
            for name, region in (("b", "eu"), ("a", "eu"), ("c", "us"), ("d", None))
        }
    a, b, c, d = nodes["a"], nodes["b"], nodes["c"], nodes["d"]
    with database.session() as session:
        r1 = queries.start_round(session, run_id, 1, 4, now=at(0)).id
        values = [
            # a: failed once, then the retry arrived.
            queries.participation_values(
                a,
                task_id=11,
                kind="fit",
                status="failed",
                attempt=1,
                reason="reset",
                bytes_down=1000,
                started_at=at(0),
                finished_at=at(1),
            ),
            queries.participation_values(
                a,
                task_id=11,
                kind="fit",
                status="ok",
                attempt=2,
                num_examples=50,
                bytes_up=300,
                bytes_up_raw=1200,
                bytes_down=1000,
                compute_s=0.5,
                duration_s=2.25,
                loss=0.75,
                metrics={"accuracy": 0.5, "note": [1, 2]},
                started_at=at(1),
                finished_at=at(3.25),
            ),
            # b: trained, then its evaluation failed: the map shows the worse outcome.
            queries.participation_values(
                b,
                task_id=12,
                kind="fit",
                status="ok",
                num_examples=40,
                bytes_up=250,
                bytes_up_raw=1000,
                bytes_down=1000,
                metrics={"accuracy": 0.25},
                started_at=at(0),
                finished_at=at(2),
            ),
            queries.participation_values(
                b,
                task_id=13,
                kind="evaluate",
                status="failed",
                reason="oom",
                bytes_down=1000,
                started_at=at(2),
                finished_at=at(3),
            ),
            queries.participation_values(
                c, task_id=14, kind="fit", status="late", bytes_down=1000, started_at=at(0)
            ),
        ]
        queries.record_participations(session, r1, values)
        queries.set_round_phase(session, r1, "fit", seconds_in_previous_phase=0.5)
        queries.commit_round(
            session,
            r1,
            checkpoint=None,
            train_loss=0.7,
            eval_loss=0.9,
            server_eval_metrics={"accuracy": 0.4},
            fit_metrics={"accuracy": 0.45},
            seconds_in_last_phase=3.5,
            now=at(4),
        )
    with database.session() as session:
        r2 = queries.start_round(session, run_id, 2, 4, now=at(4)).id
        queries.record_participation(
            session,
            r2,
            d,
            task_id=21,
            kind="fit",
            status="dropped",
            bytes_down=500,
            started_at=at(4),
        )
        queries.fail_round(session, r2, "too few clients", now=at(10))
    with database.session() as session:
        r3 = queries.start_round(session, run_id, 3, 4, now=at(10)).id
        queries.record_participation(
            session,
            r3,
            c,
            task_id=31,
            kind="fit",
            status="ok",
            num_examples=10,
            bytes_up=100,
            bytes_down=800,
            started_at=at(10),
            finished_at=at(12),
        )
        queries.commit_round(
            session, r3, checkpoint=None, server_eval_metrics={"accuracy": 0.8}, now=at(12)
        )
    yield run_id, nodes


def test_nodes_come_by_region_then_name(
    database: Database, run: tuple[int, dict[str, int]]
) -> None:
    run_id, _ = run
    with database.session() as session:
        labels = [(n.name, n.region) for n in queries.run_nodes(session, run_id)]
    assert labels == [("a", "eu"), ("b", "eu"), ("c", "us"), ("d", None)]


def test_cells_count_each_task_by_its_last_attempt(
    database: Database, run: tuple[int, dict[str, int]]
) -> None:
    run_id, n = run
    with database.session() as session:
        cells = {
            (c.round_number, c.node_id, c.status)
            for c in queries.participation_cells(session, run_id)
        }
    assert cells == {
        (1, n["a"], "ok"),
        (1, n["b"], "ok"),
        (1, n["b"], "failed"),
        (1, n["c"], "late"),
        (2, n["d"], "dropped"),
        (3, n["c"], "ok"),
    }


def test_grid_shows_the_worst_final_outcome(
    database: Database, run: tuple[int, dict[str, int]]
) -> None:
    run_id, _ = run
    data = load_report_data(database, run_id)
    grid = participation_grid(data.nodes, data.cells, data.last_round)
    named = [[GRID_STATES[code] for code in row] for row in grid.tolist()]
    assert named == [
        ["ok", "not asked", "not asked"],  # a
        ["failed", "not asked", "not asked"],  # b: fit ok, evaluation failed
        ["late", "not asked", "ok"],  # c
        ["not asked", "dropped", "not asked"],  # d
    ]


def test_region_traffic_per_round_covers_failed_rounds(
    database: Database, run: tuple[int, dict[str, int]]
) -> None:
    run_id, _ = run
    with database.session() as session:
        rows = [
            (t.round_number, t.region, t.bytes_up, t.bytes_down, t.bytes_up_raw, t.bytes_down_raw)
            for t in queries.region_traffic_by_round(session, run_id)
        ]
    assert rows == [
        (1, "eu", 550, 4000, 2200, 4000),
        (1, "us", 0, 1000, 0, 1000),
        (2, None, 0, 500, 0, 500),
        (3, "us", 100, 800, 100, 800),
    ]
    data = load_report_data(database, run_id)
    assert data.traffic_per_round().tolist() == [
        [550, 5000, 2200, 5000],
        [0, 500, 0, 500],
        [100, 800, 100, 800],
    ]


def test_participations_stream_in_round_order(
    database: Database, run: tuple[int, dict[str, int]]
) -> None:
    run_id, n = run
    with database.session() as session:
        keys = queries.participation_metric_keys(session, run_id)
        rows = list(queries.iter_participations(session, run_id))
    assert keys == ["accuracy", "note"]
    assert [(p.round_number, p.task_id, p.attempt) for p in rows] == [
        (1, 11, 1),
        (1, 11, 2),
        (1, 12, 1),
        (1, 13, 1),
        (1, 14, 1),
        (2, 21, 1),
        (3, 31, 1),
    ]
    retried = rows[1]
    assert (retried.node_id, retried.node_name, retried.node_region) == (n["a"], "a", "eu")
    assert (retried.bytes_up, retried.bytes_up_raw, retried.duration_s) == (300, 1200, 2.25)
    assert retried.metrics == {"accuracy": 0.5, "note": [1, 2]}
    assert retried.started_at == at(1) and retried.finished_at == at(3.25)
    assert rows[5].node_region is None and rows[4].finished_at is None


def test_unknown_run_is_refused(database: Database, tmp_path: Path) -> None:
    with database.session() as session:
        for query in (queries.run_nodes, queries.participation_cells, queries.run_summary):
            with pytest.raises(RunNotFoundError):
                query(session, 404)
    with pytest.raises(RunNotFoundError):
        export_csv(database, 404, tmp_path / "csv")
    with pytest.raises(RunNotFoundError):
        write_report(database, 404, tmp_path / "report")
    assert not (tmp_path / "csv").exists() and not (tmp_path / "report").exists()


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_csv_reads_back_as_the_database(
    database: Database, run: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    run_id, _ = run
    result = export_csv(database, run_id, tmp_path / "out")
    assert (result.rounds, result.participations) == (3, 7)
    rounds = _read(result.rounds_csv)
    assert [r["round"] for r in rounds] == ["1", "2", "3"]
    first, failed, last = rounds
    assert first["status"] == "committed" and failed["status"] == "failed"
    assert failed["error"] == "too few clients" and first["error"] == ""
    assert datetime.fromisoformat(first["finished_at"]) == at(4)
    assert float(first["duration_s"]) == 4.0
    # Committed totals: a's retry and b's fit count once each; c's late one is a failure.
    assert (first["num_selected"], first["num_succeeded"], first["num_failed"]) == ("3", "2", "1")
    assert (first["bytes_up"], first["bytes_up_raw"], first["bytes_down"]) == (
        "550",
        "2200",
        "5000",
    )
    assert first["train_loss"] == "0.7" and first["server_eval_loss"] == ""
    assert (
        first["server_eval_metrics.accuracy"] == "0.4"
        and last["server_eval_metrics.accuracy"] == "0.8"
    )
    assert first["fit_metrics.accuracy"] == "0.45" and last["fit_metrics.accuracy"] == ""
    assert float(first["phase_durations.select"]) == 0.5
    assert float(first["phase_durations.fit"]) == 3.5
    assert {r["run_id"] for r in rounds} == {str(run_id)}

    with database.session() as session:
        stored = {
            (p.round_number, p.task_id, p.attempt): p
            for p in queries.run_detail(session, run_id).participations
        }
    rows = _read(result.participations_csv)
    assert len(rows) == len(stored) == 7
    for row in rows:
        p = stored[(int(row["round"]), int(row["task_id"]), int(row["attempt"]))]
        assert (row["node_name"], row["node_region"], row["kind"], row["status"]) == (
            p.node_name,
            p.node_region or "",
            p.kind,
            p.status,
        )
        assert [
            int(row[k]) for k in ("bytes_up", "bytes_down", "bytes_up_raw", "bytes_down_raw")
        ] == [p.bytes_up, p.bytes_down, p.bytes_up_raw, p.bytes_down_raw]
        assert row["reason"] == (p.reason or "")
        assert (float(row["duration_s"]) if row["duration_s"] else None) == p.duration_s
        assert datetime.fromisoformat(row["started_at"]) == p.started_at
        expected_accuracy = p.metrics.get("accuracy")
        assert row["metrics.accuracy"] == (
            "" if expected_accuracy is None else repr(expected_accuracy)
        )
    retried = next(r for r in rows if r["attempt"] == "2")
    assert retried["metrics.note"] == "[1,2]" and retried["loss"] == "0.75"


def test_report_on_each_backend(
    database: Database, run: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    run_id, _ = run
    page = write_report(database, run_id, tmp_path / "report").read_text(encoding="utf-8")
    for plot in ("accuracy", "loss", "time", "bytes", "regions", "participation"):
        start = page.index(f'<figure id="plot-{plot}">')
        assert "<svg" in page[start : page.index("</figure>", start)]
    # Summary: best and final accuracy are the server's 0.8 in round 3.
    assert "0.8 (round 3)" in page
    assert "2 committed, 1 failed of 3 planned" in page
    assert math.isclose(load_report_data(database, run_id).outcome.total_s, 12.0)


def test_a_run_without_rounds_still_reports_and_exports(database: Database, tmp_path: Path) -> None:
    with database.session() as session:
        run_id = queries.create_run(session, "empty", CONFIG, 3, now=T0).id
    page = write_report(database, run_id, tmp_path / "report").read_text(encoding="utf-8")
    for what in ("accuracy", "loss", "round", "traffic", "participation"):
        assert f"no {what} recorded" in page
    result = export_csv(database, run_id, tmp_path / "csv")
    assert (result.rounds, result.participations) == (0, 0)
    assert _read(result.rounds_csv) == [] and _read(result.participations_csv) == []
