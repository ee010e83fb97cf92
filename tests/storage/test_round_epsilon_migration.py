"""Revision 0007: ``rounds.epsilon``, down to 0006 and back up with data."""

from __future__ import annotations

from sqlalchemy import inspect

from geofl.storage import (
    Database,
    current_revision,
    downgrade,
    head_revision,
    queries,
    upgrade,
)


def _columns(database: Database) -> set[str]:
    return {column["name"] for column in inspect(database.engine).get_columns("rounds")}


def _run_with_rounds(database: Database, epsilons: list[float | None]) -> int:
    with database.session() as session:
        run_id = queries.create_run(session, "dp", {}, rounds_planned=len(epsilons)).id
        for number, spent in enumerate(epsilons, start=1):
            round_id = queries.start_round(session, run_id, number, cohort_target=1).id
            queries.commit_round(session, round_id, checkpoint=None, epsilon=spent)
        return run_id


def test_epsilon_is_stored_and_read_back(database: Database) -> None:
    run_id = _run_with_rounds(database, [0.5, 0.9, None])
    with database.session() as session:
        assert [r.epsilon for r in queries.rounds_of(session, run_id)] == [0.5, 0.9, None]


def test_downgrade_drops_the_column_and_upgrade_brings_it_back_empty(database: Database) -> None:
    run_id = _run_with_rounds(database, [0.5, 1.25])
    downgrade(database, "0006")
    assert current_revision(database) == "0006"
    assert "epsilon" not in _columns(database)
    upgrade(database)
    assert current_revision(database) == head_revision() and "epsilon" in _columns(database)
    with database.session() as session:
        rounds = queries.rounds_of(session, run_id)
        assert [r.number for r in rounds] == [1, 2]  # the rounds survived, their ε did not
        assert [r.epsilon for r in rounds] == [None, None]
