"""The live progress display of ``geofl simulate``.

Every finished round prints one line (round i/N, its duration, the time since the run
started, clients ok/failed, losses and metrics), so CI logs and captured stderr keep
the whole history. On a terminal, two live bars sit below those lines: rounds done with
the elapsed time, train loss and the followed metric's latest value, and the current
round's fit tasks as they settle. Times are in the run's clock: simulated seconds on the
virtual clock, wall seconds otherwise, and every figure says which.
"""

from __future__ import annotations

from types import TracebackType
from typing import Literal

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation.summary import metric_value

__all__ = ["ClockLabel", "SimulationProgress", "round_line"]

ClockLabel = Literal["simulated", "wall"]

_CLOCK_LABELS = ("simulated", "wall")
_TASK_STATUSES = ("ok", "failed", "rejected", "late", "dropped")


def _fmt_metrics(metrics: dict[str, object]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(metrics.items())
    )


def _fit_counts(record: RoundRecord) -> tuple[int, int]:
    """Fit tasks of the round that succeeded, and those that did not."""
    statuses = [outcome.status for task, outcome in record.outcomes if task.kind == "fit"]
    ok = statuses.count("ok")
    return ok, len(statuses) - ok


def round_line(
    record: RoundRecord, status: str, elapsed_s: float, rounds: int, clock_label: str
) -> str:
    """One finished round as a log line, its times in ``clock_label`` seconds."""
    ok, failed = _fit_counts(record)
    seconds = sum(record.phase_durations.values())
    parts = [
        f"round {record.number}/{rounds} {status} in {seconds:.2f} {clock_label} s",
        f"{elapsed_s:.1f} {clock_label} s since start",
        f"clients {ok} ok, {failed} failed",
    ]
    if record.train_loss is not None:
        parts.append(f"train_loss={record.train_loss:.4g}")
    if record.eval_metrics:
        parts.append("eval: " + _fmt_metrics(dict(record.eval_metrics)))
    if record.server_eval_metrics:
        parts.append("server: " + _fmt_metrics(dict(record.server_eval_metrics)))
    return " · ".join(parts)


class _LiveBars:
    """The terminal part: a rounds bar and a bar of the current round's fit tasks."""

    def __init__(self, console: Console, rounds: int, clients_per_round: int) -> None:
        self._clients_per_round = clients_per_round
        self._progress = Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            console=console,
            transient=True,
            refresh_per_second=4,
        )
        self._rounds: TaskID = self._progress.add_task("rounds", total=rounds, detail="")
        self._clients: TaskID = self._progress.add_task(
            "fit tasks", total=clients_per_round, detail=""
        )

    def start(self) -> None:
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    def show_round(self, number: int) -> None:
        self._progress.update(
            self._clients,
            description=f"round {number} fit",
            total=self._clients_per_round,
            completed=0,
            detail="",
        )

    def show_clients(self, ok: int, failed: int) -> None:
        settled = ok + failed
        self._progress.update(
            self._clients,
            total=max(self._clients_per_round, settled),  # over-selection issues extra tasks
            completed=settled,
            detail=f"{ok} ok · {failed} failed",
        )

    def show_rounds(self, number: int, detail: str) -> None:
        self._progress.update(self._rounds, completed=number, detail=detail)


class SimulationProgress:
    """Round-by-round progress of a run, live on a terminal and line by line elsewhere.

    Use it as a context manager around the run (it starts and stops the live display)
    and feed it :meth:`round_started`, :meth:`task_settled` and :meth:`round_finished`.

    Parameters
    ----------
    console:
        Where to write; a console that is not a terminal gets only the per-round lines.
    rounds:
        Rounds planned in total (the N of "round i/N").
    clients_per_round:
        Fit tasks expected per round (the size of the clients bar).
    clock_label:
        ``"simulated"`` (virtual clock) or ``"wall"``: the unit every time is shown in.
    metric:
        The evaluation metric to follow (server-side if present, else federated).
    target:
        Shown next to the metric when given.
    """

    def __init__(
        self,
        console: Console,
        rounds: int,
        clients_per_round: int,
        *,
        clock_label: ClockLabel,
        metric: str = "accuracy",
        target: float | None = None,
    ) -> None:
        _check_arguments(rounds, clients_per_round, clock_label, metric)
        self._console = console
        self._rounds = rounds
        self._clock_label = clock_label
        self._metric = metric
        self._target = target
        self._ok = 0
        self._failed = 0
        self._latest: float | None = None
        self._bars = _LiveBars(console, rounds, clients_per_round) if console.is_terminal else None
        self._live = False

    def __enter__(self) -> SimulationProgress:
        if self._live:
            raise RuntimeError("this SimulationProgress is already displaying")
        if self._bars is not None:
            self._bars.start()
        self._live = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._bars is not None:
            self._bars.stop()
        self._live = False

    def round_started(self, number: int) -> None:
        """Round ``number`` began: its task counts start from zero."""
        self._ok = self._failed = 0
        if self._bars is not None:
            self._bars.show_round(number)

    def task_settled(self, kind: str, status: str) -> None:
        """A task of the current round settled; only ``fit`` tasks are counted.

        Raises
        ------
        ValueError
            ``status`` is not a task outcome (ok, failed, rejected, late, dropped).
        """
        if status not in _TASK_STATUSES:
            raise ValueError(f"task status {status!r} is not one of: {', '.join(_TASK_STATUSES)}")
        if kind != "fit":
            return
        if status == "ok":
            self._ok += 1
        else:
            self._failed += 1
        if self._bars is not None:
            self._bars.show_clients(self._ok, self._failed)

    def round_finished(self, record: RoundRecord, status: str, elapsed_s: float) -> None:
        """Print the round's line and move the bars.

        ``status`` is the engine's (``committed`` or ``failed: reason``); ``elapsed_s``
        is the run's clock time since it started.
        """
        value = metric_value(record.server_eval_metrics, record.eval_metrics, self._metric)
        if value is not None:
            self._latest = value
        if self._bars is not None:  # before printing, which redraws the bars below the line
            self._bars.show_clients(*_fit_counts(record))
            self._bars.show_rounds(record.number, self._rounds_detail(record, elapsed_s))
        line = round_line(record, status, elapsed_s, self._rounds, self._clock_label)
        # Statuses carry free text (error reasons): print it as is, never as markup.
        self._console.print(line, markup=False, highlight=False)

    def _rounds_detail(self, record: RoundRecord, elapsed_s: float) -> str:
        parts = [f"{elapsed_s:.1f} {self._clock_label} s"]
        if record.train_loss is not None:
            parts.append(f"train_loss={record.train_loss:.4g}")
        parts.append(f"{self._metric}={_number(self._latest)}")
        if self._target is not None:
            parts[-1] += f" (target {self._target:.4g})"
        return " · ".join(parts)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _check_arguments(rounds: int, clients_per_round: int, clock_label: str, metric: str) -> None:
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    if clients_per_round < 1:
        raise ValueError(f"clients_per_round must be at least 1, got {clients_per_round}")
    if clock_label not in _CLOCK_LABELS:
        raise ValueError(f"clock_label must be 'simulated' or 'wall', got {clock_label!r}")
    if not metric:
        raise ValueError("metric must name an evaluation metric, got an empty string")
