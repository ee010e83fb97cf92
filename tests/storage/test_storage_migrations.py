"""Migrations tested three ways: schema equals the models, one head, down-and-up with data."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import CheckConstraint, Column, Integer, MetaData, Table, inspect, select

from geofl.storage import (
    Database,
    StorageError,
    alembic_config,
    current_revision,
    downgrade,
    head_revision,
    open_database,
    queries,
    upgrade,
)
from geofl.storage.database import MIGRATIONS_DIR
from geofl.storage.models import Base, Run


def _schema_diff(database: Database, metadata: MetaData) -> list[object]:
    with database.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))


def test_single_head_and_no_ini_needed() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [head_revision()]
    assert not list(MIGRATIONS_DIR.glob("*.ini"))


def test_migrated_schema_equals_models(database: Database) -> None:
    assert current_revision(database) == head_revision()
    assert _schema_diff(database, Base.metadata) == []


def test_schema_comparison_notices_a_difference(database: Database) -> None:
    # Guards the test above: a model change the migration lacks must show up.
    changed = MetaData()
    for table in Base.metadata.tables.values():
        table.to_metadata(changed)
    Table("runs", changed, Column("extra", Integer), extend_existing=True)
    diff = _schema_diff(database, changed)
    assert any("extra" in repr(item) for item in diff)


def test_check_constraints_match_models(database: Database) -> None:
    inspector = inspect(database.engine)
    checked = 0
    for name, table in Base.metadata.tables.items():
        expected = {c.name for c in table.constraints if isinstance(c, CheckConstraint)}
        found = {c["name"] for c in inspector.get_check_constraints(name)}
        assert found == expected, name
        checked += len(expected)
    assert checked == 6


def test_fresh_database_has_no_revision_until_upgraded(database_url: str) -> None:
    with open_database(database_url, migrate=False) as database:
        assert current_revision(database) is None
        assert inspect(database.engine).get_table_names() == []
    upgrade(database_url)
    assert current_revision(database_url) == head_revision()


def test_upgrade_downgrade_upgrade_with_data(database: Database) -> None:
    with database.session() as session:
        queries.create_run(session, "before", {"lr": 0.1}, rounds_planned=3)
    downgrade(database, "base")
    assert current_revision(database) is None
    assert "runs" not in inspect(database.engine).get_table_names()
    upgrade(database)
    assert _schema_diff(database, Base.metadata) == []
    with database.session() as session:
        assert session.scalars(select(Run)).all() == []
        run = queries.create_run(session, "after", {"lr": 0.2}, rounds_planned=3)
        assert run.id >= 1
    upgrade(database)  # idempotent at head
    assert current_revision(database) == head_revision()


def test_migrations_do_not_import_geofl() -> None:
    for path in Path(MIGRATIONS_DIR, "versions").glob("[0-9]*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        modules += [
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        ]
        assert not [m for m in modules if m.startswith("geofl")], path.name


def test_database_from_a_newer_geofl_is_refused(database: Database) -> None:
    with database.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StorageError, match="revision 9999, which this geofl does not know"):
        upgrade(database)
