"""What ``geofl server`` and ``geofl simulate`` print while a run goes, and when it ends.

The round reporter and the progress hooks are the two ways a run's round and task events
reach the terminal: one line per round for a served run (native or Flower), the live
display of :class:`~geofl.server.simulation.progress.SimulationProgress` for a simulation.
Everything goes to stderr, so stdout stays free for machine-readable output.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from rich.console import Console

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.config import RunConfig, redact_url
from geofl.server.coordinator import RunResult
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation.progress import SimulationProgress
from geofl.server.simulation.summary import render_summary, summarize_run
from geofl.storage import open_database

__all__ = [
    "ProgressHooks",
    "console",
    "fail",
    "print_summary",
    "report_run",
    "round_reporter",
    "simulation_progress",
]

console = Console(stderr=True, highlight=False, soft_wrap=True)


def _fmt_metrics(metrics: dict[str, object]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items())
    )


def round_reporter(
    rounds: int | None, *, simulated: bool = False
) -> Callable[[RoundRecord, str], None]:
    """Print one line per finished round (``rounds``: how many are planned, if known)."""
    of = "" if rounds is None else f"/{rounds}"
    unit = "simulated s" if simulated else "s"

    def report(record: RoundRecord, status: str) -> None:
        ok = sum(1 for _, o in record.outcomes if o.status == "ok")
        seconds = sum(record.phase_durations.values())
        parts = [
            f"round {record.number}{of} {status} in {seconds:.2f} {unit}",
            f"{ok}/{len(record.outcomes)} tasks ok",
        ]
        if record.train_loss is not None:
            parts.append(f"train_loss={record.train_loss:.4g}")
        if record.eval_metrics:
            parts.append("eval: " + _fmt_metrics(dict(record.eval_metrics)))
        if record.server_eval_metrics:
            parts.append("server: " + _fmt_metrics(dict(record.server_eval_metrics)))
        console.print(" · ".join(parts))

    return report


class ProgressHooks(RoundObserver):
    """Feeds the engine's round and task events to a :class:`SimulationProgress`."""

    def __init__(self, progress: SimulationProgress) -> None:
        self._progress = progress
        self._start: float | None = None

    def _elapsed(self) -> float:
        now = asyncio.get_running_loop().time()  # simulated on the virtual clock
        if self._start is None:
            self._start = now
        return now - self._start

    def round_started(self, number: int, cohort_target: int) -> None:
        """A round began: its clock starts the run's elapsed time if it is the first."""
        self._elapsed()
        self._progress.round_started(number)

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        """One task of the round settled (ok, failed, late...)."""
        self._progress.task_settled(task.kind, outcome.status)

    def round_ended(self, record: RoundRecord, status: str) -> None:
        """A round ended (committed or failed), at this much time since the first began."""
        self._progress.round_finished(record, status, self._elapsed())


def simulation_progress(config: RunConfig) -> SimulationProgress:
    """The live display of a simulation of ``config``, in its clock's seconds."""
    simulation = config.simulation
    return SimulationProgress(
        console,
        config.planned_rounds,
        config.strategy.clients_per_round,
        clock_label="simulated" if simulation.clock == "virtual" else "wall",
        metric=simulation.target_metric,
        target=simulation.target_accuracy,
    )


def print_summary(config: RunConfig, result: RunResult) -> None:
    """Time-to-accuracy and bytes per region, read back from the run's database."""
    db = open_database(config.storage.url)
    try:
        summary = summarize_run(
            db,
            result.run_id,
            metric=config.simulation.target_metric,
            target=config.simulation.target_accuracy,
        )
    finally:
        db.close()
    console.print(render_summary(summary))


def report_run(result: RunResult, codes: Sequence[tuple[str, int]]) -> int:
    """How the run and its child processes (by name, exit code) ended; the exit code."""
    if result.status == "cancelled":
        return fail(ExitCode.CANCELLED, f"run {result.run_id} cancelled: {result.error}")
    if result.status != "completed":
        return fail(ExitCode.RUN_FAILED, f"run {result.run_id} failed: {result.error}")
    bad = [(name, c) for name, c in codes if c != 0]
    if bad:
        listed = ", ".join(f"{name} exited {c}" for name, c in bad)
        return fail(ExitCode.RUN_FAILED, f"run {result.run_id} completed but {listed}")
    console.print(
        f"geofl: run {result.run_id} completed; see "
        f"`geofl runs show {result.run_id} --db {redact_url(result.db_url)}`",
        markup=False,
    )
    return int(ExitCode.OK)


def fail(code: ExitCode, message: str) -> int:
    """Print ``message`` as the command's error; return ``code`` to exit with."""
    console.print(f"geofl: error: {message}", markup=False)
    return int(code)
