"""A PostgreSQL connection lost during ``COMMIT`` is settled, not guessed.

PostgreSQL stopped (``pg_ctl stop -m fast``) while a unit's ``COMMIT`` is in flight ends
the connection: the client cannot tell whether the commit was applied. Before, the
coordinator then stopped (exit 3). Now the unit's transaction id, read before the
``COMMIT``, is looked up once the database answers (``pg_xact_status``): a committed unit
is done, a rolled-back one runs again. Nothing is lost or doubled either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from geofl.storage import Database, Event, StorageUnavailableError, open_database, queries

pytestmark = pytest.mark.postgres


@pytest.fixture
def db(postgres_url: str) -> Iterator[Database]:
    opened = open_database(postgres_url, retry_s=30)
    try:
        yield opened
    finally:
        opened.close()


def _events(db: Database) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(Event)) or 0)


def _dropped() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection"), True)


def _reply_lost_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The next ``COMMIT`` is applied, and then its connection 'drops' before the reply."""
    commit = Session.commit
    calls: list[int] = []

    def applied_then_lost(session: Session) -> None:
        commit(session)
        calls.append(1)
        if len(calls) == 1:
            raise _dropped()

    monkeypatch.setattr(Session, "commit", applied_then_lost)
    return calls


def _terminate_before_commit_once(db: Database) -> Callable[[Session], None]:
    """A listener that ends the session's backend just before its first ``COMMIT``."""
    fired: list[int] = []

    def terminate(session: Session) -> None:
        if fired:
            return
        fired.append(1)
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with db.engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

    return terminate


def _add_event(runs: list[int]) -> Callable[[Session], str]:
    def work(session: Session) -> str:
        runs.append(1)
        queries.add_event(session, "test.unit", "one unit of work")
        return "done"

    return work


def test_a_unit_applied_but_lost_in_the_reply_is_not_run_again(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reply_lost_once(monkeypatch)
    runs: list[int] = []
    assert db.transact(_add_event(runs)) == "done"
    assert len(runs) == 1
    assert _events(db) == 1


def test_a_unit_whose_commit_never_arrived_runs_again_once(db: Database) -> None:
    event.listen(db.sessionmaker, "before_commit", _terminate_before_commit_once(db))
    runs: list[int] = []
    assert db.transact(_add_event(runs)) == "done"
    assert len(runs) == 2  # the first attempt's transaction was rolled back by PostgreSQL
    assert _events(db) == 1


def test_session_with_its_commit_applied_but_lost_does_not_raise(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    _reply_lost_once(monkeypatch)
    with db.session() as session:
        queries.add_event(session, "test.unit", "one unit of work")
    assert _events(db) == 1


def test_session_whose_commit_never_arrived_says_so(db: Database) -> None:
    event.listen(db.sessionmaker, "before_commit", _terminate_before_commit_once(db))
    lost = "lost before the unit of work was committed"
    with pytest.raises(StorageUnavailableError, match=lost), db.session() as session:
        queries.add_event(session, "test.unit", "one unit of work")
    assert _events(db) == 0  # and, unlike transact, a with-block cannot be run again


def test_a_read_only_unit_lost_at_its_commit_returns_what_it_read(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.session() as session:
        queries.add_event(session, "test.unit", "one unit of work")
    calls = _reply_lost_once(monkeypatch)

    def count(session: Session) -> Any:
        return session.scalar(select(func.count()).select_from(Event))

    assert db.transact(count) == 1
    assert calls == [1]
