"""Link measurements on every backend: store, read back, cascade, migrate, and show."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from rich.console import Console
from sqlalchemy import delete, func, inspect, select

from geofl.server.cli.inspect import detail_tables, run_inspect
from geofl.server.scheduling import LinkEstimate, LinkEstimator
from geofl.storage import (
    Database,
    NodeMeasurement,
    NodeMeasurementRecord,
    RecordNotFoundError,
    RunNotFoundError,
    current_revision,
    downgrade,
    head_revision,
    queries,
    upgrade,
)
from geofl.storage.models import Base, Round, Run

T0 = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
FAST = LinkEstimate(
    1,
    rtt_s=0.02,
    down_bps=200e6,
    up_bps=50e6,
    samples_per_s=1234.5,
    availability=0.91,
    observations=4,
    last_round=1,
)


def _setup(database: Database, rounds: int = 2) -> tuple[int, list[int], list[int]]:
    """A run with nodes 'a' (eu-west) and 'b' (ap-south) and ``rounds`` rounds."""
    with database.session() as session:
        run = queries.create_run(session, "links", {"x": 1}, rounds_planned=rounds, now=T0)
        nodes = [
            queries.upsert_node(session, run.id, name, region, {}, now=T0).id
            for name, region in (("a", "eu-west"), ("b", "ap-south"))
        ]
        round_ids = [
            queries.start_round(session, run.id, number, 2, now=T0).id
            for number in range(1, rounds + 1)
        ]
        return run.id, nodes, round_ids


def _estimate(node_id: int, **changes: float | int | None) -> LinkEstimate:
    return replace(FAST, node_id=node_id, **changes)  # type: ignore[arg-type]


def _values(record: NodeMeasurementRecord) -> tuple[object, ...]:
    return (
        record.node_id,
        record.rtt_s,
        record.down_bps,
        record.up_bps,
        record.samples_per_s,
        record.availability,
        record.observations,
        record.last_round,
    )


def _as_stored(estimate: LinkEstimate) -> tuple[object, ...]:
    return (
        estimate.node_id,
        estimate.rtt_s,
        estimate.down_bps,
        estimate.up_bps,
        estimate.samples_per_s,
        estimate.availability,
        estimate.observations,
        estimate.last_round,
    )


def test_round_trip_by_round_and_latest_per_node(database: Database) -> None:
    run_id, (a, b), (first, second) = _setup(database)
    a1, b1 = _estimate(a), LinkEstimate(b, availability=0.0, observations=1, last_round=1)
    a2 = _estimate(a, rtt_s=0.03, down_bps=150e6, observations=6, last_round=2)
    with database.session() as session:
        rows = queries.record_measurements(session, first, [a1, b1])
        assert [row.node_id for row in rows] == [a, b]
        queries.record_measurements(session, second, [a2])
    with database.session() as session:
        stored = queries.measurements_of(session, run_id)
        assert [(m.round_number, _values(m)) for m in stored] == [
            (1, _as_stored(a1)),
            (1, _as_stored(b1)),
            (2, _as_stored(a2)),
        ]
        assert [m.node_region for m in stored] == ["eu-west", "ap-south", "eu-west"]
        only_second = queries.measurements_of(session, run_id, round=2)
        assert [(m.round_id, m.node_name) for m in only_second] == [(second, "a")]
        latest = queries.latest_measurements(session, run_id)
        assert [(m.round_number, _values(m)) for m in latest] == [
            (2, _as_stored(a2)),
            (1, _as_stored(b1)),  # not measured in round 2: its round-1 row
        ]
        assert json.loads(json.dumps(latest[0].to_dict()))["down_bps"] == 150e6


def test_recording_a_node_again_overwrites_its_row(database: Database) -> None:
    _, (a, b), (first, _) = _setup(database)
    with database.session() as session:
        queries.record_measurements(session, first, [_estimate(a), _estimate(b)])
        queries.record_measurements(session, first, [_estimate(a, rtt_s=None, observations=9)])
    with database.session() as session:
        rows = session.scalars(select(NodeMeasurement).order_by(NodeMeasurement.node_id)).all()
        assert [(row.node_id, row.rtt_s, row.observations) for row in rows] == [
            (a, None, 9),
            (b, 0.02, 4),
        ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"down_bps": -1.0}, r"estimates\[1\] \(node \d+\): down_bps must be a finite number"),
        ({"rtt_s": float("inf")}, "rtt_s must be a finite number >= 0"),
        ({"availability": 1.5}, "availability must be at most 1"),
        ({"observations": -2}, "observations must be >= 0"),
    ],
)
def test_bad_values_are_named_and_nothing_is_written(
    database: Database, change: dict[str, float], message: str
) -> None:
    _, (a, b), (first, _) = _setup(database)
    with database.session() as session:
        with pytest.raises(ValueError, match=message):
            queries.record_measurements(session, first, [_estimate(a), _estimate(b, **change)])
        assert session.scalar(select(func.count()).select_from(NodeMeasurement)) == 0


def test_unknown_rounds_nodes_and_runs_are_refused(database: Database) -> None:
    run_id, (a, _), (first, _) = _setup(database)
    with database.session() as session:
        other = queries.create_run(session, "other", {}, rounds_planned=1, now=T0)
        stranger = queries.upsert_node(session, other.id, "z", None, {}, now=T0).id
    with database.session() as session:
        with pytest.raises(RecordNotFoundError, match="round id 999"):
            queries.record_measurements(session, 999, [_estimate(a)])
        with pytest.raises(RecordNotFoundError, match=f"not part of run {run_id}"):
            queries.record_measurements(session, first, [_estimate(stranger)])
        with pytest.raises(ValueError, match=f"node {a} appears twice"):
            queries.record_measurements(session, first, [_estimate(a), _estimate(a)])
        with pytest.raises(RunNotFoundError):
            queries.measurements_of(session, 12345)
        with pytest.raises(RunNotFoundError):
            queries.latest_measurements(session, 12345)
        assert queries.latest_measurements(session, other.id) == []


def test_measurements_go_with_their_round_and_run(database: Database) -> None:
    run_id, (a, b), (first, second) = _setup(database)
    with database.session() as session:
        queries.record_measurements(session, first, [_estimate(a), _estimate(b)])
        queries.record_measurements(session, second, [_estimate(a)])
    with database.session() as session:
        session.execute(delete(Round).where(Round.id == first))
    with database.session() as session:
        assert [m.round_number for m in queries.measurements_of(session, run_id)] == [2]
        session.execute(delete(Run).where(Run.id == run_id))
    with database.session() as session:
        assert session.scalar(select(func.count()).select_from(NodeMeasurement)) == 0


def test_an_estimator_survives_a_restart_through_the_database(database: Database) -> None:
    run_id, (a, b), (first, _) = _setup(database)
    estimator = LinkEstimator()
    estimator.load([_estimate(a), _estimate(b, rtt_s=0.25, up_bps=None)])
    estimator.observe_handshake(b, 0.3)
    with database.session() as session:
        queries.record_measurements(session, first, estimator.snapshot())
    restored = LinkEstimator()
    with database.session() as session:
        restored.load(queries.latest_measurements(session, run_id))
    assert restored.estimates() == estimator.estimates()


def test_upgrade_from_0003_adds_the_table(database: Database) -> None:
    run_id, (a, _), (first, _) = _setup(database)
    with database.session() as session:
        queries.record_measurements(session, first, [_estimate(a)])
    downgrade(database, "0003")
    assert current_revision(database) == "0003"
    assert "node_measurements" not in inspect(database.engine).get_table_names()
    with database.session() as session:  # what came before is untouched
        assert queries.get_run(session, run_id).name == "links"
    upgrade(database)
    assert current_revision(database) == head_revision()
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert list(compare_metadata(context, Base.metadata)) == []
    with database.session() as session:
        assert queries.measurements_of(session, run_id) == []
        queries.record_measurements(session, first, [_estimate(a)])
        assert len(queries.latest_measurements(session, run_id)) == 1


def _url(database: Database) -> str:
    return database.engine.url.render_as_string(hide_password=False)


def _rendered(tables: list[object]) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    for table in tables:
        console.print(table)
    return console.export_text()


def test_runs_show_has_a_links_table(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, (a, b), (first, second) = _setup(database)
    slow = LinkEstimate(b, rtt_s=0.2, down_bps=20e6, up_bps=5e6, samples_per_s=100.0)
    with database.session() as session:
        queries.record_measurements(session, first, [_estimate(a), slow])
        queries.record_measurements(session, second, [_estimate(a, rtt_s=0.04)])
        detail = queries.run_detail(session, run_id)
        links = queries.latest_measurements(session, run_id)
    text = _rendered(list(detail_tables(detail, links)))
    assert "links (measured)" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if "│" in line}
    a_row = [cell.strip() for cell in rows[f"{a} a"].split("│")]
    assert a_row[2:10] == ["eu-west", "2", "40.0", "200.00", "50.00", "1234.5", "0.91", "4"]
    b_row = [cell.strip() for cell in rows[f"{b} b"].split("│")]
    assert b_row[2:10] == ["ap-south", "1", "200.0", "20.00", "5.00", "100.0", "-", "0"]
    assert "links (measured)" not in _rendered(list(detail_tables(detail)))

    arguments = argparse.Namespace(
        command="runs", runs_command="show", run_id=run_id, db=_url(database), json=True
    )
    assert run_inspect(arguments) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(m["node_name"], m["round_number"]) for m in shown["links"]] == [("a", 2), ("b", 1)]
    arguments.json = False
    assert run_inspect(arguments) == 0
    assert "links (measured)" in capsys.readouterr().out


def test_runs_show_reads_a_database_from_before_measurements(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id, _, _ = _setup(database)
    downgrade(database, "0003")
    arguments = argparse.Namespace(
        command="runs", runs_command="show", run_id=run_id, db=_url(database), json=True
    )
    assert run_inspect(arguments) == 0
    assert json.loads(capsys.readouterr().out)["links"] == []
