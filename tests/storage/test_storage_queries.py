"""Contract suite for the query functions, run on every backend (see conftest.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import delete, func, select

from geofl.storage import (
    CheckpointRecord,
    Database,
    RecordNotFoundError,
    RoundStateError,
    RunNotFoundError,
    config_digest,
    open_database,
    queries,
)
from geofl.storage.models import Checkpoint, Event, Node, Participation, Round, Run

T0 = datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
CONFIG = {"run": {"name": "demo", "rounds": 3}, "strategy": {"name": "fedavg", "lr": 0.1}}
RECORD = CheckpointRecord("ab" * 32 + ".safetensors", "ab" * 32, 1234, 4)


def _new_run(database: Database, name: str = "demo") -> int:
    with database.session() as session:
        return queries.create_run(session, name, CONFIG, rounds_planned=3, now=T0).id


def _nodes(database: Database, run_id: int, *names: str) -> list[int]:
    with database.session() as session:
        return [queries.upsert_node(session, run_id, n, "eu-west", {"cpu": 2}).id for n in names]


def _fit(database: Database, round_id: int, node_id: int, task_id: int, **kwargs: object) -> None:
    fields: dict[str, object] = {"status": "ok", "bytes_up": 100, "bytes_down": 40}
    fields.update(kwargs)
    with database.session() as session:
        queries.record_participation(
            session,
            round_id,
            node_id,
            task_id=task_id,
            kind="fit",
            **fields,  # type: ignore[arg-type]
        )


def test_create_and_find_resumable_run(database: Database) -> None:
    first = _new_run(database)
    second = _new_run(database)
    with database.session() as session:
        found = queries.find_resumable_run(session, "demo", config_digest(CONFIG))
        assert found is not None and found.id == second
        assert queries.find_resumable_run(session, "demo", config_digest({"x": 1})) is None
        assert queries.find_resumable_run(session, "other", config_digest(CONFIG)) is None
        queries.finish_run(session, second, "completed")
    with database.session() as session:
        found = queries.find_resumable_run(session, "demo", config_digest(CONFIG))
        assert found is not None and found.id == first
        run = queries.get_run(session, first)
        assert run.config == CONFIG
        assert run.created_at == T0
        assert run.last_committed_round == 0 and run.simulated_clock is False


def test_config_digest_ignores_key_order() -> None:
    assert config_digest({"a": 1, "b": {"c": 2, "d": 3}}) == config_digest(
        {"b": {"d": 3, "c": 2}, "a": 1}
    )
    assert config_digest({"a": 1}) != config_digest({"a": 2})


def test_rejoining_node_keeps_its_id(database: Database) -> None:
    run_id = _new_run(database)
    other_run = _new_run(database, "other")
    (node_id,) = _nodes(database, run_id, "site-a")
    with database.session() as session:
        queries.mark_node(session, node_id, "offline")
    with database.session() as session:
        again = queries.upsert_node(session, run_id, "site-a", "us-east", {"cpu": 8})
        assert again.id == node_id
        assert (again.region, again.status, again.node_config) == ("us-east", "online", {"cpu": 8})
        assert queries.upsert_node(session, other_run, "site-a", None).id != node_id
        assert queries.mark_run_nodes(session, run_id, "offline") == 1
    with database.session() as session:
        assert session.get(Node, node_id).status == "offline"  # type: ignore[union-attr]
        with pytest.raises(RecordNotFoundError):
            queries.mark_node(session, 10_000, "offline")
        with pytest.raises(ValueError, match="online"):
            queries.mark_node(session, node_id, "asleep")


def test_round_commit_writes_everything_in_one_unit(database: Database) -> None:
    run_id = _new_run(database)
    a, b, c = _nodes(database, run_id, "a", "b", "c")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=3, now=T0).id
        queries.set_round_phase(session, round_id, "fit", seconds_in_previous_phase=1.5)
    _fit(database, round_id, a, 1, num_examples=10, loss=0.5, metrics={"acc": 0.9})
    _fit(database, round_id, b, 2, status="failed", reason="OOM", attempt=1)
    _fit(database, round_id, b, 2, attempt=2)
    _fit(database, round_id, c, 3, status="dropped", bytes_up=0)
    with database.session() as session:
        queries.set_round_phase(session, round_id, "aggregate", seconds_in_previous_phase=2.0)
        queries.commit_round(
            session,
            round_id,
            checkpoint=RECORD,
            train_loss=0.25,
            fit_metrics={"acc": np.float32(0.75)},
            seconds_in_last_phase=0.5,
            now=T0 + timedelta(seconds=12),
        )
    with database.session() as session:
        row = session.get(Round, round_id)
        assert row is not None
        assert (row.status, row.phase, row.duration_s) == ("committed", "commit", 12.0)
        assert (row.num_selected, row.num_succeeded, row.num_failed) == (3, 2, 1)
        assert (row.bytes_up, row.bytes_down) == (300, 160)
        assert row.phase_durations == {"select": 1.5, "fit": 2.0, "aggregate": 0.5}
        assert row.fit_metrics == {"acc": 0.75} and row.train_loss == 0.25
        assert queries.get_run(session, run_id).last_committed_round == 1
        saved = queries.latest_checkpoint(session, run_id)
        assert saved is not None and saved.id == row.checkpoint_id and saved.round == 1
        assert CheckpointRecord.from_row(saved) == RECORD


def test_failed_transaction_leaves_no_trace(database: Database) -> None:
    run_id = _new_run(database)
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=1).id
    with pytest.raises(RuntimeError, match="disk full"), database.session() as session:
        queries.commit_round(session, round_id, checkpoint=RECORD)
        raise RuntimeError("disk full")
    with database.session() as session:
        assert session.get(Round, round_id).status == "running"  # type: ignore[union-attr]
        assert queries.get_run(session, run_id).last_committed_round == 0
        assert queries.latest_checkpoint(session, run_id) is None


def test_committed_round_cannot_change(database: Database) -> None:
    run_id = _new_run(database)
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=1).id
        queries.commit_round(session, round_id, checkpoint=None)
    with database.session() as session:
        with pytest.raises(RoundStateError, match="committed"):
            queries.commit_round(session, round_id, checkpoint=None)
        with pytest.raises(RoundStateError):
            queries.start_round(session, run_id, 1, cohort_target=1)
        with pytest.raises(RoundStateError):
            queries.fail_round(session, round_id, "late failure")
        with pytest.raises(RoundStateError):
            queries.set_round_phase(session, round_id, "fit")


@pytest.mark.parametrize("ending", ["crash", "failed", "aborted"])
def test_restarting_an_interrupted_round(database: Database, ending: str) -> None:
    run_id = _new_run(database)
    (node_id,) = _nodes(database, run_id, "a")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=2, now=T0).id
        queries.set_round_phase(session, round_id, "fit", seconds_in_previous_phase=3.0)
    _fit(database, round_id, node_id, 7)
    if ending != "crash":
        with database.session() as session:
            queries.fail_round(session, round_id, "server stopped", status=ending)
            assert session.get(Round, round_id).status == ending  # type: ignore[union-attr]
    later = T0 + timedelta(minutes=5)
    with database.session() as session:
        again = queries.start_round(session, run_id, 1, cohort_target=4, now=later)
    assert again.id == round_id
    with database.session() as session:
        row = session.get(Round, round_id)
        assert row is not None
        assert (row.status, row.phase, row.cohort_target) == ("running", "select", 4)
        assert row.started_at == later and row.phase_durations == {} and row.error is None
        count = select(func.count()).select_from(Participation)
        assert session.scalar(count.where(Participation.round_id == round_id)) == 0
        kinds = session.scalars(select(Event.kind).where(Event.run_id == run_id)).all()
        assert kinds == ["round.restarted"]
    _fit(database, round_id, node_id, 7)  # the same task id is free again


def test_participation_is_idempotent_per_task_attempt(database: Database) -> None:
    run_id = _new_run(database)
    other_run = _new_run(database, "other")
    (node_id,) = _nodes(database, run_id, "a")
    (stranger,) = _nodes(database, other_run, "a")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=1).id
    _fit(database, round_id, node_id, 1, status="late")
    _fit(database, round_id, node_id, 1, status="ok", bytes_up=5)
    with database.session() as session:
        rows = session.scalars(select(Participation)).all()
        assert [(p.status, p.bytes_up) for p in rows] == [("ok", 5)]
        with pytest.raises(RecordNotFoundError, match="not part of run"):
            queries.record_participation(
                session, round_id, stranger, task_id=2, kind="fit", status="ok"
            )
        with pytest.raises(ValueError):
            queries.record_participation(
                session, round_id, node_id, task_id=3, kind="train", status="ok"
            )


def test_run_listing_and_detail_are_plain_json(database: Database) -> None:
    run_id = _new_run(database)
    _new_run(database, "second")
    a, b = _nodes(database, run_id, "a", "b")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=2).id
    _fit(database, round_id, b, 2, metrics={"blob": b"\x00\x01", "bad": float("nan")})
    _fit(database, round_id, a, 1)
    with database.session() as session:
        queries.commit_round(session, round_id, checkpoint=RECORD, eval_loss=float("inf"))
        queries.finish_run(session, run_id, "failed", "diverged")
    with database.session() as session:
        summaries = queries.list_runs(session)
        detail = queries.run_detail(session, run_id)
    assert [s.name for s in summaries] == ["demo", "second"]
    assert (summaries[0].num_nodes, summaries[0].bytes_up, summaries[1].bytes_up) == (2, 200, 0)
    assert detail.run.status == "failed" and detail.run.error == "diverged"
    assert [p.node_name for p in detail.participations] == ["b", "a"]
    assert detail.participations[0].metrics == {"blob": "AAE=", "bad": "NaN"}
    assert detail.participations[0].node_region == "eu-west"
    as_dict = json.loads(json.dumps(detail.to_dict()))
    assert as_dict["run"]["created_at"] == T0.isoformat()
    assert as_dict["rounds"][0]["number"] == 1 and as_dict["config"] == CONFIG
    assert json.loads(json.dumps(summaries[1].to_dict()))["status"] == "running"
    with database.session() as session, pytest.raises(RunNotFoundError):
        queries.run_detail(session, 999)


def test_events_and_time_handling(database: Database) -> None:
    run_id = _new_run(database)
    with database.session() as session:
        queries.add_event(session, "run.resumed", "resumed", run_id=run_id, data={"round": 2})
        queries.add_event(session, "server.started", "no run yet")
        with pytest.raises(ValueError, match="naive"):
            queries.add_event(session, "x", "y", now=datetime(2025, 1, 1))
    with database.session() as session:
        events = session.scalars(select(Event).order_by(Event.id)).all()
        assert [(e.kind, e.run_id, e.data) for e in events] == [
            ("run.resumed", run_id, {"round": 2}),
            ("server.started", None, {}),
        ]
        assert all(e.created_at.tzinfo is not None for e in events)


def test_deleting_a_run_cascades(database: Database) -> None:
    run_id = _new_run(database)
    (node_id,) = _nodes(database, run_id, "a")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=1).id
    _fit(database, round_id, node_id, 1)
    with database.session() as session:
        queries.commit_round(session, round_id, checkpoint=RECORD)
    with database.session() as session:
        session.execute(delete(Run).where(Run.id == run_id))
    with database.session() as session:
        for model in (Node, Round, Participation, Checkpoint):
            assert session.scalar(select(func.count()).select_from(model)) == 0, model


def test_concurrent_writers_do_not_collide(database: Database) -> None:
    # The gRPC servicer records uploads from many threads while the round engine writes.
    run_id = _new_run(database)
    nodes = _nodes(database, run_id, "a", "b", "c")
    with database.session() as session:
        round_id = queries.start_round(session, run_id, 1, cohort_target=3).id

    def upload(index: int) -> None:
        for task in range(10):
            _fit(database, round_id, nodes[index], index * 100 + task)

    with ThreadPoolExecutor(max_workers=3) as pool:
        for future in [pool.submit(upload, index) for index in range(3)]:
            future.result()
    with database.session() as session:
        queries.commit_round(session, round_id, checkpoint=None)
        assert session.get(Round, round_id).num_selected == 30  # type: ignore[union-attr]


def test_bulk_node_upsert_keeps_ids_and_updates_regions(database_url: str) -> None:
    db = open_database(database_url)
    try:
        with db.session() as session:
            run_id = queries.create_run(session, "bulk", CONFIG, rounds_planned=1, now=T0).id
            first = queries.upsert_nodes(session, run_id, [("a", "x"), ("b", None)], now=T0)
        with db.session() as session:
            again = queries.upsert_nodes(session, run_id, [("b", "y"), ("c", "x"), ("a", "x")])
            regions = {n.name: n.region for n in session.scalars(select(Node))}
        assert again[0] == first[1] and again[2] == first[0] and again[1] not in first
        assert regions == {"a": "x", "b": "y", "c": "x"}
        with db.session() as session, pytest.raises(ValueError, match="unique"):
            queries.upsert_nodes(session, run_id, [("a", None), ("a", None)])
    finally:
        db.close()


def test_bulk_participations_overwrite_by_key_and_refuse_strangers(database_url: str) -> None:
    db = open_database(database_url)
    try:
        with db.session() as session:
            run_id = queries.create_run(session, "parts", CONFIG, rounds_planned=1, now=T0).id
            node = queries.upsert_node(session, run_id, "n", None, now=T0).id
            round_id = queries.start_round(session, run_id, 1, 2, now=T0).id
            rows = [
                queries.participation_values(node, task_id=t, kind="fit", status="ok")
                for t in (1, 2)
            ]
            queries.record_participations(session, round_id, rows)
            late = queries.participation_values(node, task_id=2, kind="fit", status="late")
            queries.record_participations(session, round_id, [late])
            statuses = sorted((p.task_id, p.status) for p in session.scalars(select(Participation)))
            assert statuses == [(1, "ok"), (2, "late")]
            stranger = queries.participation_values(node + 999, task_id=3, kind="fit", status="ok")
            with pytest.raises(RecordNotFoundError, match="not part of run"):
                queries.record_participations(session, round_id, [stranger])
    finally:
        db.close()
