"""How a ServerApp's rounds reach the database: strategy results, non-round groups."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from geofl.server.nodes.outcomes import Outcome
from geofl.storage import Database, open_database, queries
from geofl.storage.models import Event

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    flwr_app = pytest.importorskip("flwr.app")

from geofl.server.flower.grid import group_of, round_of
from geofl.server.flower.recording import RoundBook


@pytest.fixture
def book(tmp_path: Path) -> Iterator[tuple[RoundBook, Database, int]]:
    db = open_database(f"sqlite:///{tmp_path / 'geofl.db'}")
    with db.session() as session:
        run_id = queries.create_run(session, "flower", {}, 2).id
    yield RoundBook(db, run_id), db, run_id
    db.close()


def _events(db: Database, kind: str) -> list[Any]:
    with db.session() as session:
        return list(session.scalars(select(Event).where(Event.kind == kind)))


def test_strategy_results_join_their_round(book: tuple[RoundBook, Database, int]) -> None:
    rounds, db, run_id = book
    rounds.computed(0, "server", {"accuracy": 0.1})  # before round 1: an event
    assert rounds.pushed(1, "fit", cohort=2) == 1
    rounds.computed(1, "fit", {"custom": 7.0, "train_loss": 0.0, "a-list": [1.0, 2.0]})
    rounds.computed(1, "evaluate", {"eval_loss": 0.25})
    rounds.computed(1, "server", {"accuracy": 0.9, "loss": 0.5})
    rounds.finish(None)
    with db.session() as session:
        (only,) = queries.run_detail(session, run_id).rounds
    assert only.fit_metrics == {"custom": 7.0, "train_loss": 0.0}  # lists are left out
    assert only.train_loss == 0.0  # the strategy's own loss, even when it is 0
    assert only.eval_loss == 0.25
    assert (only.server_eval_loss, only.server_eval_metrics) == (
        0.5,
        {"accuracy": 0.9, "loss": 0.5},
    )
    (initial,) = _events(db, "flower.server_evaluation")
    assert (initial.round, initial.data["metrics"]) == (0, {"accuracy": 0.1})
    assert "evaluate_fn" in initial.message


def test_a_group_is_recorded_once_all_its_replies_are_in(
    book: tuple[RoundBook, Database, int],
) -> None:
    rounds, db, _ = book
    rounds.pushed(1, "fit")
    for _ in range(3):
        rounds.group_pushed("final", "evaluate")
    rounds.group_settled("final", "evaluate", Outcome("ok"))
    rounds.group_settled("final", "evaluate", Outcome("failed", "boom"))
    assert _events(db, "flower.group") == []
    rounds.group_settled("final", "evaluate", Outcome("ok"))
    (group,) = _events(db, "flower.group")
    assert group.data["group_id"] == "final"
    assert (group.data["messages"], group.data["succeeded"], group.data["failed"]) == (3, 2, 1)
    rounds.group_pushed("late", "evaluate")
    rounds.finish(None)  # an unfinished group is still recorded at the end
    assert len(_events(db, "flower.group")) == 2


@pytest.mark.parametrize(
    ("group_id", "config", "expected"),
    [
        ("3", {}, ((3, "evaluate"), None)),
        ("", {"server-round": 2}, ((2, "evaluate"), None)),
        ("final", {}, ((0, "evaluate"), "final")),
        ("0", {}, ((0, "evaluate"), None)),  # the legacy workflow's initial parameters
    ],
)
def test_a_group_id_that_names_no_round_is_a_group(
    group_id: str, config: dict[str, Any], expected: tuple[Any, Any]
) -> None:
    content = flwr_app.RecordDict({"config": flwr_app.ConfigRecord(config)})
    metadata = flwr_app.Metadata(
        run_id=1,
        message_id="m",
        src_node_id=1,
        dst_node_id=2,
        reply_to_message_id="",
        group_id=group_id,
        created_at=0.0,
        ttl=60.0,
        message_type="evaluate",
    )
    message = flwr_app.Message(content=content, metadata=metadata)
    assert (round_of(message), group_of(message)) == expected
