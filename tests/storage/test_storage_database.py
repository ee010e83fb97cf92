"""Opening databases: SQLite settings, sessions, and one clear line when unreachable."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from sqlalchemy import select

import geofl.storage
from geofl.storage import (
    Database,
    DatabaseURLError,
    StorageUnavailableError,
    current_revision,
    head_revision,
    open_database,
    queries,
    redact_url,
)
from geofl.storage.models import Run


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_unreachable_postgres_is_one_line_without_password() -> None:
    url = f"postgresql+psycopg://geofl:s3cret-pw@127.0.0.1:{_closed_port()}/geofl"
    with pytest.raises(StorageUnavailableError) as caught:
        open_database(url)
    message = str(caught.value)
    assert "\n" not in message
    assert "s3cret-pw" not in message
    assert "***" in caught.value.url and "refused" in caught.value.reason.lower()
    assert message.startswith(f"database {caught.value.url} is unavailable: ")


def test_sqlite_path_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where a folder should be", encoding="utf-8")
    with pytest.raises(StorageUnavailableError, match="cannot create directory") as caught:
        open_database(f"sqlite:///{blocker / 'runs' / 'geofl.db'}")
    assert "\n" not in str(caught.value)


def test_sqlite_directory_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(StorageUnavailableError, match="unable to open"):
        open_database(f"sqlite:///{tmp_path}")


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("nonsense://user:hunter2@host/db", "unsupported database URL"),
        ("mysql+nodriver://user:hunter2@host/db", "unsupported database URL"),
        ("not a url hunter2", "not a database URL"),
    ],
)
def test_bad_urls_are_clear(url: str, match: str) -> None:
    with pytest.raises(DatabaseURLError, match=match) as caught:
        open_database(url)
    assert "hunter2" not in str(caught.value)


def test_redact_url() -> None:
    assert redact_url("postgresql://u:pw@h/d") == "postgresql://u:***@h/d"
    assert redact_url("::::") == "<unparseable database URL>"


def test_sqlite_file_is_created_with_settings(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "geofl.db"
    with open_database(f"sqlite:///{path}") as database:
        assert path.is_file() and current_revision(database) == head_revision()
        with database.engine.connect() as connection:
            pragma = connection.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar() == "wal"
            assert pragma("PRAGMA foreign_keys").scalar() == 1
            assert pragma("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert pragma("PRAGMA busy_timeout").scalar() == 30_000


def test_in_memory_sqlite_is_shared_across_sessions() -> None:
    with open_database("sqlite://") as database:
        with database.session() as session:
            queries.create_run(session, "memory", {}, rounds_planned=1)
        with database.session() as session:
            assert session.scalars(select(Run.name)).all() == ["memory"]


def test_session_commits_or_rolls_back(database: Database) -> None:
    with pytest.raises(KeyError), database.session() as session:
        queries.create_run(session, "lost", {}, rounds_planned=1)
        raise KeyError("boom")
    with database.session() as session:
        queries.create_run(session, "kept", {}, rounds_planned=1)
    with database.session() as session:
        assert session.scalars(select(Run.name)).all() == ["kept"]


def test_public_names_exist() -> None:
    for name in geofl.storage.__all__:
        assert hasattr(geofl.storage, name), name
    assert sorted(geofl.storage.__all__) == sorted(set(geofl.storage.__all__))
