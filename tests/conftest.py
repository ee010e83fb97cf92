"""Fixtures shared by every test folder: one fresh database per test, per backend.

Every test that takes ``database_url`` runs on SQLite (a file in
``tmp_path``) and on PostgreSQL. PostgreSQL needs ``GEOFL_TEST_POSTGRES_URL`` (an
administrative URL such as ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``,
see ``.ci/postgres.sh``); each test gets its own ``CREATE DATABASE`` and it is dropped
afterwards. Without the variable the PostgreSQL cases are skipped, unless
``GEOFL_REQUIRE_POSTGRES=1`` (set in CI), in which case they fail.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url
from sqlalchemy.pool import NullPool

POSTGRES_URL_ENV = "GEOFL_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "GEOFL_REQUIRE_POSTGRES"


def _postgres_admin_url() -> str:
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if url:
        return url
    message = f"PostgreSQL tests need {POSTGRES_URL_ENV} (start one with .ci/postgres.sh)"
    if os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_POSTGRES_ENV}=1 forbids skipping them")
    pytest.skip(message)


def _postgres_database() -> Iterator[str]:
    admin_url = _postgres_admin_url()
    name = f"geofl_test_{uuid.uuid4().hex[:16]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of an empty PostgreSQL database (not yet migrated), for PostgreSQL-only tests."""
    yield from _postgres_database()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty database on each backend (not yet migrated)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'geofl.db'}"
    else:
        yield from _postgres_database()
