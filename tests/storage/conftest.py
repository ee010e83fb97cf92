"""Fixtures for the storage contract suite (``database_url`` lives in ``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from geofl.storage import Database, open_database


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    """An opened, migrated database on each backend."""
    opened = open_database(database_url)
    try:
        yield opened
    finally:
        opened.close()
