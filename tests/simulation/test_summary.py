"""The end-of-run summary, computed from a real database (SQLite, and PostgreSQL in CI)."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from geofl.server.simulation.summary import (
    NO_REGION,
    RegionTraffic,
    RoundPoint,
    RunSummary,
    metric_value,
    render_summary,
    summarize_run,
)
from geofl.storage import Database, RunNotFoundError, open_database, queries

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
CONFIG = {"run": {"name": "sim", "rounds": 4}}


def at(seconds: float) -> datetime:
    """``seconds`` after the run's start."""
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    opened = open_database(database_url)
    try:
        yield opened
    finally:
        opened.close()


def new_run(database: Database, *, simulated: bool = True, rounds: int = 4) -> int:
    with database.session() as session:
        run = queries.create_run(session, "sim", CONFIG, rounds, simulated, now=T0)
        return run.id


def add_nodes(database: Database, run_id: int, regions: Mapping[str, str | None]) -> dict[str, int]:
    with database.session() as session:
        return {
            name: queries.upsert_node(session, run_id, name, region, now=T0).id
            for name, region in regions.items()
        }


def play_round(
    database: Database,
    run_id: int,
    number: int,
    span: tuple[float, float],
    tasks: list[tuple[int, str, str, int, int]],
    *,
    eval_metrics: Mapping[str, object] | None = None,
    server_eval_metrics: Mapping[str, object] | None = None,
    fail: bool = False,
) -> None:
    """Round ``number`` from ``span[0]`` to ``span[1]`` seconds after the run's start.

    ``tasks``: (node id, kind, status, bytes up, bytes down) per participation.
    """
    with database.session() as session:
        round_id = queries.start_round(session, run_id, number, 3, now=at(span[0])).id
        for task_id, (node_id, kind, status, up, down) in enumerate(tasks, start=number * 100):
            queries.record_participation(
                session,
                round_id,
                node_id,
                task_id=task_id,
                kind=kind,
                status=status,
                bytes_up=up,
                bytes_down=down,
                started_at=at(span[0]),
            )
        if fail:
            queries.fail_round(session, round_id, "too few clients", now=at(span[1]))
            return
        queries.commit_round(
            session,
            round_id,
            checkpoint=None,
            train_loss=0.5,
            eval_metrics=eval_metrics,
            server_eval_metrics=server_eval_metrics,
            now=at(span[1]),
        )


@pytest.fixture
def four_rounds(database: Database) -> int:
    """A simulated run: 0.5 (fed.), failed, 0.8 (server; fed. says 0.6), 0.75 (fed.)."""
    run_id = new_run(database)
    n = add_nodes(database, run_id, {"a": "eu-west", "b": "eu-west", "c": "us-east", "d": None})
    a, b, c, d = n["a"], n["b"], n["c"], n["d"]
    play_round(
        database,
        run_id,
        1,
        (0, 10),
        [(a, "fit", "ok", 100, 1000), (c, "fit", "ok", 200, 1000), (d, "fit", "failed", 0, 1000)],
        eval_metrics={"accuracy": 0.5},
    )
    play_round(
        database,
        run_id,
        2,
        (10, 25),
        [(a, "fit", "ok", 100, 1000), (c, "fit", "dropped", 0, 400)],
        fail=True,
    )
    play_round(
        database,
        run_id,
        3,
        (25, 40.5),
        [(b, "fit", "ok", 150, 1000), (c, "fit", "ok", 200, 1000)],
        eval_metrics={"accuracy": 0.6, "loss_ratio": 2.0},
        server_eval_metrics={"accuracy": 0.8},
    )
    play_round(
        database,
        run_id,
        4,
        (40.5, 70),
        [(a, "fit", "ok", 100, 1000), (b, "evaluate", "ok", 7, 500), (d, "fit", "ok", 50, 1000)],
        eval_metrics={"accuracy": 0.75},
    )
    return run_id


def test_time_to_target_is_the_first_round_at_or_above_it(
    database: Database, four_rounds: int
) -> None:
    summary = summarize_run(database, four_rounds, target=0.7)
    assert summary.simulated and summary.clock_unit == "simulated seconds"
    assert (summary.rounds_planned, summary.rounds_committed, summary.rounds_failed) == (4, 3, 1)
    assert summary.total_s == 70.0
    assert summary.rounds == (
        RoundPoint(1, "committed", 10.0, 0.5),
        RoundPoint(2, "failed", 25.0, None),
        RoundPoint(3, "committed", 40.5, 0.8),  # server-side evaluation wins over federated
        RoundPoint(4, "committed", 70.0, 0.75),
    )
    assert (summary.target_round, summary.target_elapsed_s) == (3, 40.5)
    assert (summary.best_metric, summary.best_round) == (0.8, 3)
    assert (summary.final_metric, summary.final_round) == (0.75, 4)


def test_an_exactly_met_target_counts_as_reached(database: Database, four_rounds: int) -> None:
    summary = summarize_run(database, four_rounds, target=0.75)
    assert (summary.target_round, summary.target_elapsed_s) == (3, 40.5)
    first = summarize_run(database, four_rounds, target=0.5)
    assert (first.target_round, first.target_elapsed_s) == (1, 10.0)


def test_an_unreached_target_leaves_the_best_value(database: Database, four_rounds: int) -> None:
    summary = summarize_run(database, four_rounds, target=0.9)
    assert summary.target == 0.9
    assert summary.target_round is None and summary.target_elapsed_s is None
    assert (summary.best_metric, summary.best_round) == (0.8, 3)
    assert summarize_run(database, four_rounds).target_round is None


def test_another_metric_is_followed_where_it_was_measured(
    database: Database, four_rounds: int
) -> None:
    summary = summarize_run(database, four_rounds, metric="loss_ratio", target=1.0)
    assert [point.metric for point in summary.rounds] == [None, None, 2.0, None]
    assert (summary.target_round, summary.final_round, summary.final_metric) == (3, 3, 2.0)


def test_bytes_are_summed_per_region_over_every_participation(
    database: Database, four_rounds: int
) -> None:
    summary = summarize_run(database, four_rounds)
    # eu-west: a (fit in rounds 1, 2, 4) and b (fit in round 3, evaluate in round 4).
    assert summary.regions == (
        RegionTraffic("eu-west", 2, 100 + 100 + 150 + 100 + 7, 1000 * 4 + 500),
        RegionTraffic("us-east", 1, 200 + 0 + 200, 1000 + 400 + 1000),
        RegionTraffic(NO_REGION, 1, 0 + 50, 1000 + 1000),
    )
    assert summary.bytes_up == 457 + 400 + 50
    assert summary.bytes_down == 4500 + 2400 + 2000


def test_rounds_still_running_are_left_out(database: Database, four_rounds: int) -> None:
    with database.session() as session:
        queries.start_round(session, four_rounds, 5, 3, now=at(80))
    summary = summarize_run(database, four_rounds)
    assert [point.number for point in summary.rounds] == [1, 2, 3, 4]
    assert summary.total_s == 70.0


def test_a_run_without_rounds_has_nothing_measured(database: Database) -> None:
    run_id = new_run(database, simulated=False, rounds=2)
    summary = summarize_run(database, run_id, target=0.5)
    assert summary.clock_unit == "wall seconds"
    assert summary.rounds == () and summary.regions == ()
    assert summary.total_s == 0.0 and (summary.bytes_up, summary.bytes_down) == (0, 0)
    assert summary.best_metric is None and summary.final_metric is None
    text = render(summary)
    assert "wall seconds" in text and "not measured" in text and "not reached" in text


def test_non_numbers_count_as_not_measured(database: Database) -> None:
    run_id = new_run(database)
    node = add_nodes(database, run_id, {"a": "eu"})["a"]
    fit = [(node, "fit", "ok", 1, 1)]
    play_round(database, run_id, 1, (0, 1), fit, server_eval_metrics={"accuracy": math.nan})
    play_round(database, run_id, 2, (1, 2), fit, eval_metrics={"accuracy": True})
    play_round(database, run_id, 3, (2, 3), fit, eval_metrics={"accuracy": "high"})
    summary = summarize_run(database, run_id, target=0.1)
    assert [point.metric for point in summary.rounds] == [None, None, None]
    assert summary.best_metric is None and summary.target_round is None


def test_bad_arguments_are_named(database: Database, four_rounds: int) -> None:
    with pytest.raises(RunNotFoundError):
        summarize_run(database, four_rounds + 1)
    with pytest.raises(ValueError, match="metric"):
        summarize_run(database, four_rounds, metric="")
    with pytest.raises(ValueError, match="target must be a finite number"):
        summarize_run(database, four_rounds, target=math.nan)


def render(summary: RunSummary) -> str:
    out = io.StringIO()
    Console(file=out, width=200, force_terminal=False).print(render_summary(summary))
    return out.getvalue()


def test_rendering_states_the_clock_and_the_numbers(database: Database, four_rounds: int) -> None:
    text = render(summarize_run(database, four_rounds, target=0.7))
    assert "(simulated seconds)" in text and "wall" not in text
    assert "reached at round 3 after 40.5 simulated seconds" in text
    assert "70.0 simulated seconds (1m 10s)" in text
    assert "0.8 (round 3)" in text and "0.75 (round 4)" in text
    assert "3 committed, 1 failed of 4 planned" in text
    for region, up, down in (("eu-west", 457, 4500), ("us-east", 400, 2400), ("(none)", 50, 2000)):
        line = next(line for line in text.splitlines() if region in line)
        assert str(up) in line and str(down) in line
    totals = next(line for line in text.splitlines() if "total" in line and "907" in line)
    assert "8900" in totals


def test_names_are_printed_as_text_not_markup(database: Database) -> None:
    run_id = new_run(database)
    node = add_nodes(database, run_id, {"a": "[bold]lab[/]"})["a"]
    play_round(database, run_id, 1, (0, 1), [(node, "fit", "ok", 3, 4)])
    text = render(summarize_run(database, run_id, metric="[red]acc"))
    assert "[bold]lab[/]" in text and "best [red]acc" in text


def test_metric_value_prefers_the_server_side_evaluation() -> None:
    assert metric_value({"accuracy": 0.9}, {"accuracy": 0.7}, "accuracy") == 0.9
    assert metric_value({}, {"accuracy": 0.7}, "accuracy") == 0.7
    assert metric_value({"accuracy": "NaN"}, {"accuracy": 1}, "accuracy") == 1.0
    assert metric_value({"f1": 0.9}, {}, "accuracy") is None


@pytest.fixture(scope="module")
def shared_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One SQLite database for the property test; each example adds its own run."""
    path: Path = tmp_path_factory.mktemp("summary") / "geofl.db"
    opened = open_database(f"sqlite:///{path}")
    try:
        yield opened
    finally:
        opened.close()


values = st.one_of(st.none(), st.floats(min_value=0, max_value=1))


@settings(max_examples=20, deadline=None)
@given(metrics=st.lists(values, min_size=1, max_size=6), target=st.floats(0.05, 1))
def test_time_to_target_matches_a_scan_of_the_rounds(
    shared_database: Database, metrics: list[float | None], target: float
) -> None:
    run_id = new_run(shared_database, rounds=len(metrics))
    node = add_nodes(shared_database, run_id, {"a": "eu"})["a"]
    for number, value in enumerate(metrics, start=1):
        evaluation = {} if value is None else {"accuracy": value}
        span = (number * 10.0 - 10, number * 10.0)
        play_round(
            shared_database,
            run_id,
            number,
            span,
            [(node, "fit", "ok", 1, 1)],
            eval_metrics=evaluation,
        )
    summary = summarize_run(shared_database, run_id, target=target)
    reached = [n for n, v in enumerate(metrics, start=1) if v is not None and v >= target]
    measured = [v for v in metrics if v is not None]
    assert summary.target_round == (reached[0] if reached else None)
    assert summary.target_elapsed_s == (reached[0] * 10.0 if reached else None)
    assert summary.best_metric == (max(measured) if measured else None)
    assert summary.final_metric == (measured[-1] if measured else None)
    assert summary.total_s == len(metrics) * 10.0
