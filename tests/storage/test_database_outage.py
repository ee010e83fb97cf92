"""A database that goes away is ridden out with bounded retries; nothing is lost or doubled.

:meth:`geofl.storage.Database.session` retries starting its transaction (SQLite past its
busy timeout, PostgreSQL refusing connections) for up to ``retry_s`` seconds; the unit of
work then runs once. Past ``retry_s`` it raises :class:`StorageUnavailableError`.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from geofl.storage import Event, StorageUnavailableError, database, open_database, queries

from ..conftest import _postgres_database


def _events(url: str) -> int:
    with open_database(url, migrate=False) as db, db.session() as session:
        return int(session.scalar(select(func.count()).select_from(Event)) or 0)


def _hold_sqlite_lock(path: Path, seconds: float, locked: threading.Event) -> threading.Thread:
    def hold() -> None:
        connection = sqlite3.connect(path, isolation_level=None, timeout=5)
        connection.execute("BEGIN EXCLUSIVE")
        locked.set()
        time.sleep(seconds)
        connection.execute("ROLLBACK")
        connection.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite gives up on a lock after 0.3 s, so the retry (not the busy wait) rides it out."""
    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_MS", 300)


def test_sqlite_locked_by_another_connection_is_ridden_out(
    tmp_path: Path, short_busy_timeout: None
) -> None:
    path = tmp_path / "geofl.db"
    url = f"sqlite:///{path}"
    db = open_database(url, retry_s=30)
    locked = threading.Event()
    holder = _hold_sqlite_lock(path, 3.0, locked)
    assert locked.wait(5)
    started = time.monotonic()
    with db.session() as session:
        queries.add_event(session, "test.write", "written once the lock is gone")
    waited = time.monotonic() - started
    holder.join(10)
    db.close()
    assert waited >= 2.0  # it did wait for the other connection
    assert db.outages == 1 and db.outage_s >= 2.0
    assert _events(url) == 1


def test_sqlite_lock_longer_than_retry_s_fails_clearly(
    tmp_path: Path, short_busy_timeout: None
) -> None:
    path = tmp_path / "geofl.db"
    db = open_database(f"sqlite:///{path}", retry_s=1.0)
    locked = threading.Event()
    holder = _hold_sqlite_lock(path, 4.0, locked)
    assert locked.wait(5)
    with pytest.raises(StorageUnavailableError) as failed, db.session() as session:
        queries.add_event(session, "test.write", "never written")
    assert "database is locked" in str(failed.value) and "retried for" in str(failed.value)
    holder.join(10)
    db.close()
    assert _events(f"sqlite:///{path}") == 0


def test_recovery_is_reported(tmp_path: Path, short_busy_timeout: None) -> None:
    path = tmp_path / "geofl.db"
    heard: list[float] = []
    db = open_database(f"sqlite:///{path}", retry_s=30)
    db.on_recovered = heard.append
    locked = threading.Event()
    holder = _hold_sqlite_lock(path, 1.5, locked)
    assert locked.wait(5)
    with db.session() as session:
        queries.add_event(session, "test.write", "after the lock")
    holder.join(10)
    db.close()
    assert len(heard) == 1 and heard[0] >= 1.0


# ------------------------------------------------------------------ PostgreSQL


def _pg_ctl(*args: str) -> None:
    """Run pg_ctl as the postgres user (as .ci/postgres.sh does)."""
    data = os.environ["GEOFL_TEST_POSTGRES_DATADIR"]
    binary = str(Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin")) / "pg_ctl")
    command = [binary, "-D", data, *args]
    if os.getuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, check=True, capture_output=True, timeout=60)


def _server_options() -> str:
    """The options the running server was started with (its postmaster.opts)."""
    data = Path(os.environ["GEOFL_TEST_POSTGRES_DATADIR"])
    words = shlex.split((data / "postmaster.opts").read_text())[1:]
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "-D":
            skip = True
        else:
            kept.append(word)
    return shlex.join(kept)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if not os.environ.get("GEOFL_TEST_POSTGRES_DATADIR"):
        pytest.skip("needs GEOFL_TEST_POSTGRES_DATADIR (eval $(bash .ci/postgres.sh start))")
    yield from _postgres_database()


@pytest.mark.postgres
def test_postgresql_stopped_and_restarted_is_ridden_out(postgres_url: str) -> None:
    db = open_database(postgres_url, retry_s=60)
    options = _server_options()
    data = os.environ["GEOFL_TEST_POSTGRES_DATADIR"]
    with db.session() as session:
        queries.add_event(session, "test.before", "before the outage")
    _pg_ctl("-m", "fast", "-w", "stop")
    down_s = 5.0

    def come_back() -> None:
        time.sleep(down_s)
        _pg_ctl("-l", f"{data}/server.log", "-w", "-t", "60", "-o", options, "start")

    restarter = threading.Thread(target=come_back, daemon=True)
    restarter.start()
    started = time.monotonic()
    try:
        with db.session() as session:
            queries.add_event(session, "test.during", "written once the server is back")
    finally:
        restarter.join(90)
    waited = time.monotonic() - started
    db.close()
    assert waited >= down_s - 1.0
    assert db.outages == 1
    assert _events(postgres_url) == 2  # neither lost nor doubled
