"""The live progress display: one line per round off a terminal, live bars on one."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from typing import Literal

import pytest
from rich.console import Console

from geofl.protocols.types import Metrics
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskKindName, TaskRecord
from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation.progress import SimulationProgress, round_line


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """Task records hold a future, and a future needs a loop (none needs to run)."""
    created = asyncio.new_event_loop()
    try:
        yield created
    finally:
        created.close()


Status = Literal["ok", "failed", "rejected", "late", "dropped"]


def record(
    loop: asyncio.AbstractEventLoop,
    number: int,
    settled: list[tuple[TaskKindName, Status]],
    *,
    phase_durations: dict[str, float] | None = None,
    train_loss: float | None = None,
    eval_metrics: Metrics | None = None,
    server_eval_metrics: Metrics | None = None,
) -> RoundRecord:
    """A finished round whose tasks settled with these (kind, status) pairs."""
    outcomes = [
        (TaskRecord(i, i, kind, number, number - 1, {}, 0.0, loop.create_future()), Outcome(status))
        for i, (kind, status) in enumerate(settled)
    ]
    return RoundRecord(
        number,
        phase_durations=dict(phase_durations or {}),
        outcomes=outcomes,
        train_loss=train_loss,
        eval_metrics=dict(eval_metrics or {}),
        server_eval_metrics=dict(server_eval_metrics or {}),
    )


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=400), out


def test_round_line_has_every_figure(loop: asyncio.AbstractEventLoop) -> None:
    finished = record(
        loop,
        2,
        [("fit", "ok"), ("fit", "ok"), ("fit", "late"), ("evaluate", "ok")],
        phase_durations={"fit": 3.0, "commit": 0.5},
        train_loss=0.43219,
        eval_metrics={"accuracy": 0.7},
        server_eval_metrics={"accuracy": 0.8125},
    )
    line = round_line(finished, "committed", 12.34, 5, "simulated")
    assert line == (
        "round 2/5 committed in 3.50 simulated s · 12.3 simulated s since start · "
        "clients 2 ok, 1 failed · train_loss=0.4322 · eval: accuracy=0.7 · "
        "server: accuracy=0.8125"
    )


def test_off_a_terminal_each_round_prints_one_line(loop: asyncio.AbstractEventLoop) -> None:
    console, out = plain_console()
    with SimulationProgress(console, 3, 2, clock_label="wall") as progress:
        progress.round_started(1)
        progress.task_settled("fit", "ok")
        progress.task_settled("fit", "dropped")
        first = record(loop, 1, [("fit", "ok"), ("fit", "dropped")], train_loss=1.5)
        progress.round_finished(first, "committed", 4.0)
        progress.round_started(2)
        second = record(loop, 2, [("fit", "failed"), ("fit", "rejected")])
        progress.round_finished(second, "failed: 0 of 2 clients succeeded", 9.25)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("round 1/3 committed in 0.00 wall s · 4.0 wall s since start")
    assert "clients 1 ok, 1 failed · train_loss=1.5" in lines[0]
    assert lines[1].startswith("round 2/3 failed: 0 of 2 clients succeeded")
    assert "9.2 wall s since start · clients 0 ok, 2 failed" in lines[1]
    assert "━" not in out.getvalue() and "\x1b" not in out.getvalue()  # no live bars


def test_reasons_are_printed_verbatim_not_as_markup(loop: asyncio.AbstractEventLoop) -> None:
    console, out = plain_console()
    progress = SimulationProgress(console, 1, 1, clock_label="simulated")
    progress.round_finished(record(loop, 1, []), "failed: [bold]strategy[/] overflow", 1.0)
    assert "failed: [bold]strategy[/] overflow" in out.getvalue()


def test_on_a_terminal_the_bars_show_the_round_and_the_latest_metric(
    loop: asyncio.AbstractEventLoop,
) -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    assert console.is_terminal
    with SimulationProgress(
        console, 3, 4, clock_label="simulated", metric="accuracy", target=0.9
    ) as progress:
        for number in (1, 2, 3):
            progress.round_started(number)
            progress.task_settled("fit", "ok")
            progress.task_settled("evaluate", "failed")
            progress.task_settled("fit", "late")
            # Only round 2 measures accuracy: round 3 keeps showing it.
            metrics: Metrics = {"accuracy": 0.8125} if number == 2 else {}
            done = record(loop, number, [("fit", "ok"), ("fit", "late")], eval_metrics=metrics)
            progress.round_finished(done, "committed", 100.0 * number)
    text = out.getvalue()
    assert "round 3/3 committed" in text  # the per-round lines are printed above the bars
    assert "3/3" in text.split("round 3/3 committed")[-1]  # the rounds bar at the end
    assert "300.0 simulated s" in text
    assert "accuracy=0.8125 (target 0.9)" in text.split("round 3/3 committed")[-1]
    assert "1 ok · 1 failed" in text


def test_task_counts_follow_fit_tasks_of_the_current_round() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    progress = SimulationProgress(console, 2, 3, clock_label="wall")
    progress.round_started(1)
    for status in ("ok", "ok", "dropped"):
        progress.task_settled("fit", status)
    progress.task_settled("evaluate", "ok")
    progress.round_started(2)
    progress.task_settled("fit", "failed")
    with progress:  # displaying renders the current state once more on exit
        pass
    assert "round 2 fit" in out.getvalue()
    assert "0 ok · 1 failed" in out.getvalue()


def test_unknown_task_status_is_refused() -> None:
    progress = SimulationProgress(plain_console()[0], 1, 1, clock_label="wall")
    with pytest.raises(ValueError, match="task status 'done' is not one of: ok, failed"):
        progress.task_settled("fit", "done")


@pytest.mark.parametrize(
    ("rounds", "clients", "label", "metric", "message"),
    [
        (0, 1, "wall", "accuracy", "rounds must be at least 1, got 0"),
        (1, 0, "wall", "accuracy", "clients_per_round must be at least 1, got 0"),
        (1, 1, "virtual", "accuracy", "clock_label must be 'simulated' or 'wall', got 'virtual'"),
        (1, 1, "wall", "", "metric must name an evaluation metric"),
    ],
)
def test_bad_arguments_are_named(
    rounds: int, clients: int, label: str, metric: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        SimulationProgress(
            plain_console()[0],
            rounds,
            clients,
            clock_label=label,  # type: ignore[arg-type]
            metric=metric,
        )


def test_entering_twice_is_refused() -> None:
    progress = SimulationProgress(plain_console()[0], 1, 1, clock_label="wall")
    with progress, pytest.raises(RuntimeError, match="already displaying"):
        progress.__enter__()
