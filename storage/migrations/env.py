"""Alembic environment for geofl's schema.

Normally run from :mod:`geofl.storage.database`, which hands over a connection in
``config.attributes["connection"]`` so migrations join the caller's transaction and use
its SQLite settings. Without one, ``sqlalchemy.url`` from the configuration is opened.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from geofl.storage.database import open_database
from geofl.storage.models import Base

config = context.config
# For autogenerate only: migrations themselves never import the models.
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection to run geofl migrations")
    database = open_database(url, migrate=False)
    try:
        with database.engine.begin() as connection:
            _run(connection)
    finally:
        database.close()


def _run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    _run_offline()
else:
    _run_online()
