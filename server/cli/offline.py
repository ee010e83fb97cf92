"""Opening a recorded run's database for reading (``geofl runs ... --db URL``).

Shared by ``runs list|show`` and ``runs report|export``: reading must not create an empty
SQLite file as a side effect, and a database without geofl's schema is a clear error, not
a "no such table".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import make_url

from geofl.storage import (
    Database,
    StorageUnavailableError,
    current_revision,
    open_database,
    redact_url,
)

__all__ = [
    "DEFAULT_DB",
    "database_url",
    "open_recorded_database",
    "require_existing_sqlite",
    "require_schema",
]

DEFAULT_DB = "sqlite:///runs/geofl.db"


def database_url(given: str | None) -> str:
    """``--db`` if given, else ``$GEOFL_DB``, else :data:`DEFAULT_DB`."""
    return str(given or os.environ.get("GEOFL_DB") or DEFAULT_DB)


def require_existing_sqlite(url: str) -> None:
    """Reading must not create an empty SQLite file as a side effect.

    Raises
    ------
    StorageUnavailableError
        ``url`` names a SQLite file that does not exist.
    """
    parsed = make_url(url)
    path = parsed.database
    is_file = parsed.get_backend_name() == "sqlite" and path and path != ":memory:"
    if is_file and not Path(str(path)).exists():
        raise StorageUnavailableError(url, f"no database file at {path}")


def require_schema(db: Database, url: str) -> None:
    """Refuse a database that holds no geofl schema yet.

    Call it before opening a session: a session starts its (on SQLite write-locking)
    transaction at once, and this check takes a connection of its own.

    Raises
    ------
    StorageUnavailableError
        No migration was ever applied to the database.
    """
    if current_revision(db) is None:
        raise StorageUnavailableError(
            redact_url(url),
            "it holds no geofl schema yet; start a server on it or "
            f"run `geofl db upgrade --db {redact_url(url)}`",
        )


@contextmanager
def open_recorded_database(url: str) -> Iterator[Database]:
    """The existing database at ``url``, opened without migrating, schema checked.

    Raises
    ------
    StorageUnavailableError
        The database is missing, unreachable, or holds no geofl schema.
    geofl.storage.DatabaseURLError
        ``url`` is not a database URL geofl supports.
    """
    require_existing_sqlite(url)
    with open_database(url, migrate=False) as db:
        require_schema(db, url)
        yield db
