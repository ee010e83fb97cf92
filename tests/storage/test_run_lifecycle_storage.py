"""Run statuses in the database: the 0006 migration, reopening, and choosing by name."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from geofl.storage import Database, RoundStateError, RunStatus, downgrade, queries, upgrade
from geofl.storage.models import Event, Node, Round, Run

T0 = datetime(2026, 12, 3, tzinfo=UTC)


def _run_with_children(database: Database, name: str = "life") -> int:
    with database.session() as session:
        run = queries.create_run(session, name, {"x": 1}, rounds_planned=2, now=T0)
        queries.upsert_node(session, run.id, "a", "eu", {}, now=T0)
        queries.start_round(session, run.id, 1, 1, now=T0)
        queries.add_event(session, "run.started", "started", run_id=run.id, now=T0)
        return run.id


def _counts(database: Database) -> tuple[int, int, int]:
    with database.session() as session:
        nodes, rounds, events = (
            session.scalar(select(func.count()).select_from(table)) or 0
            for table in (Node, Round, Event)
        )
        return nodes, rounds, events


@pytest.mark.parametrize("status", list(RunStatus))
def test_every_status_is_accepted(database: Database, status: RunStatus) -> None:
    run_id = _run_with_children(database)
    if status is not RunStatus.RUNNING:
        with database.session() as session:
            queries.finish_run(session, run_id, status, "why", now=T0)
    with database.session() as session:
        assert queries.get_run(session, run_id).status == status.value


def test_an_unknown_status_is_refused_by_the_check(database: Database) -> None:
    run_id = _run_with_children(database)
    with pytest.raises(IntegrityError), database.session() as session:
        queries.get_run(session, run_id).status = "paused"
        session.flush()


def test_upgrade_to_0006_keeps_every_row_that_refers_to_a_run(database: Database) -> None:
    """Rebuilding ``runs`` (SQLite batch mode) must not cascade to its nodes, rounds, events."""
    _run_with_children(database)
    before = _counts(database)
    downgrade(database, "0005")
    assert _counts(database) == before
    upgrade(database)
    assert _counts(database) == before == (1, 1, 1)


def test_downgrade_folds_the_new_statuses_into_the_old(database: Database) -> None:
    stopped, cancelled = _run_with_children(database, "a"), _run_with_children(database, "b")
    with database.session() as session:
        queries.finish_run(session, stopped, RunStatus.INTERRUPTED, None, now=T0)
        queries.finish_run(session, cancelled, RunStatus.CANCELLED, "operator", now=T0)
    downgrade(database, "0005")
    with database.session() as session:
        statuses = {row.id: row.status for row in session.execute(select(Run.id, Run.status))}
    assert statuses == {stopped: "running", cancelled: "failed"}
    upgrade(database)


def test_resumable_runs_are_found_and_reopened(database: Database) -> None:
    run_id = _run_with_children(database)
    with database.session() as session:
        queries.finish_run(session, run_id, RunStatus.INTERRUPTED, "SIGTERM", now=T0)
        digest = queries.get_run(session, run_id).config_sha256
    with database.session() as session:
        found = queries.find_resumable_run(session, "life", digest)
        assert found is not None and found.id == run_id
        reopened = queries.reopen_run(session, run_id, now=T0)
        assert (reopened.status, reopened.error, reopened.finished_at) == ("running", None, None)


@pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED])
def test_ended_runs_neither_resume_nor_reopen(database: Database, status: RunStatus) -> None:
    run_id = _run_with_children(database)
    with database.session() as session:
        queries.finish_run(session, run_id, status, None, now=T0)
        digest = queries.get_run(session, run_id).config_sha256
    with database.session() as session:
        assert queries.find_resumable_run(session, "life", digest) is None
        assert queries.latest_run_named(session, "life").id == run_id  # type: ignore[union-attr]
        with pytest.raises(RoundStateError, match=f"run {run_id} is {status.value}"):
            queries.reopen_run(session, run_id)


def test_finish_run_needs_how_the_run_stopped(database: Database) -> None:
    run_id = _run_with_children(database)
    with pytest.raises(ValueError, match="cancelled or interrupted"), database.session() as s:
        queries.finish_run(s, run_id, RunStatus.RUNNING)
