"""Accuracy-over-time curves for :mod:`benchmarks.wan_schedule`, and its Flower run.

A :class:`Curve` is one run's rounds: when each ended (simulated seconds since the run
began), the server-side test accuracy after it, and the bytes its participations moved.
geofl's comes from the run's database (:func:`read_geofl_curve`); Flower's from the events
its ServerApp logs (:mod:`benchmarks.wan_schedule_flower`) plus round durations computed
from the link model (:func:`flower_curve`), since Flower's simulation has no clock of its
own for links.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from benchmarks.core import BenchmarkError, RunContext, free_port, stop_trees
from benchmarks.flower_system import FlowerSimulationSystem
from benchmarks.procmon import ProcessMonitor, ProcSample
from geofl.server.simulation.links import ClientLink
from geofl.storage import open_database
from geofl.storage.models import Participation, Round, Run

__all__ = [
    "Curve",
    "flower_curve",
    "flower_pyproject",
    "flower_round_s",
    "read_events",
    "read_geofl_curve",
    "run_flower",
]

_POLL_S = 1.0
_SAMPLE_S = 0.5
_MAX_RSS_BYTES = 16 * 10**9


@dataclass
class Curve:
    """One run, round by round (lists of equal length, in round order).

    ``times`` are simulated seconds from the start of the run to the end of each round;
    ``accuracy`` is None for a round without a server evaluation (a failed round).
    """

    rounds: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    accuracy: list[float | None] = field(default_factory=list)
    bytes_up: list[int] = field(default_factory=list)
    bytes_down: list[int] = field(default_factory=list)
    status: list[str] = field(default_factory=list)
    fits: list[dict[str, int]] = field(default_factory=list)

    def add(
        self,
        number: int,
        t: float,
        accuracy: float | None,
        up: int,
        down: int,
        status: str = "committed",
        fits: Mapping[str, int] | None = None,
    ) -> None:
        """Append round ``number``."""
        self.rounds.append(number)
        self.times.append(t)
        self.accuracy.append(accuracy)
        self.bytes_up.append(up)
        self.bytes_down.append(down)
        self.status.append(status)
        self.fits.append(dict(fits or {}))

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        """The curve :meth:`as_dict` wrote."""
        return cls(**{key: list(data[key]) for key in cls.__dataclass_fields__})

    def points(self, initial_accuracy: float) -> tuple[list[float], list[float]]:
        """Times and accuracies to plot: the initial model at 0 s, then evaluated rounds."""
        times, accuracy = [0.0], [initial_accuracy]
        for t, value in zip(self.times, self.accuracy, strict=True):
            if value is not None:
                times.append(t)
                accuracy.append(value)
        return times, accuracy

    def first_at_least(self, target: float) -> int | None:
        """Index of the first round whose accuracy reached ``target``; None if none did."""
        return next(
            (i for i, value in enumerate(self.accuracy) if value is not None and value >= target),
            None,
        )

    def first_held(self, target: float, window: int) -> int | None:
        """Index of the first round that starts ``window`` consecutive evaluations at or
        above ``target`` (rounds without one are skipped); None if there is no such run."""
        evaluated = [i for i, value in enumerate(self.accuracy) if value is not None]
        for start in range(len(evaluated) - window + 1):
            span = evaluated[start : start + window]
            if all(self.accuracy[i] >= target for i in span):  # type: ignore[operator]
                return span[0]
        return None

    def summary(self, target: float, window: int) -> dict[str, Any]:
        """Time, rounds and bytes to ``target``, first reached and held for ``window``
        evaluations; final (mean of the last ``window`` evaluations), last and best
        accuracy; totals."""
        evaluated = [value for value in self.accuracy if value is not None]
        moved = [up + down for up, down in zip(self.bytes_up, self.bytes_down, strict=True)]
        hit, held = self.first_at_least(target), self.first_held(target, window)
        return {
            "time_to_target_s": None if hit is None else self.times[hit],
            "time_to_target_held_s": None if held is None else self.times[held],
            "rounds_to_target": None if hit is None else self.rounds[hit],
            "bytes_to_target": None if hit is None else sum(moved[: hit + 1]),
            "final_accuracy": sum(evaluated[-window:]) / len(evaluated[-window:])
            if evaluated
            else None,
            "last_accuracy": evaluated[-1] if evaluated else None,
            "best_accuracy": max(evaluated, default=None),
            "bytes_total": sum(moved),
            "rounds_run": len(self.rounds),
            "failed_rounds": sum(1 for status in self.status if status != "committed"),
            "duration_s": self.times[-1] if self.times else 0.0,
        }


# ---------------------------------------------------------------- geofl


def _fit_counts(session: Any, run_id: int) -> dict[int, dict[str, int]]:
    rows = session.execute(
        select(Participation.round_id, Participation.status, func.count())
        .join(Round, Participation.round_id == Round.id)
        .where(Round.run_id == run_id, Participation.kind == "fit")
        .group_by(Participation.round_id, Participation.status)
    )
    counts: dict[int, dict[str, int]] = {}
    for round_id, status, count in rows:
        counts.setdefault(round_id, {})[status] = count
    return counts


def _bytes(session: Any, run_id: int) -> dict[int, tuple[int, int]]:
    rows = session.execute(
        select(
            Participation.round_id,
            func.sum(Participation.bytes_up),
            func.sum(Participation.bytes_down),
        )
        .join(Round, Participation.round_id == Round.id)
        .where(Round.run_id == run_id)
        .group_by(Participation.round_id)
    )
    return {round_id: (int(up or 0), int(down or 0)) for round_id, up, down in rows}


def read_geofl_curve(url: str) -> Curve:
    """The curve of the (only) run in the database at ``url``.

    A round's time is ``finished_at - Run.created_at``: simulated seconds on the virtual
    clock. Bytes are every participation's (fit and evaluation, any status) bytes up and
    down as recorded: an update that arrived after the deadline is recorded without its
    upload bytes.
    """
    db = open_database(url)
    try:
        with db.session() as session:
            run = session.scalars(select(Run)).one()
            rounds = list(
                session.scalars(select(Round).where(Round.run_id == run.id).order_by(Round.number))
            )
            moved, counts = _bytes(session, run.id), _fit_counts(session, run.id)
            curve = Curve()
            for row in rounds:
                if row.finished_at is None:
                    continue
                accuracy = row.server_eval_metrics.get("accuracy")
                up, down = moved.get(row.id, (0, 0))
                curve.add(
                    row.number,
                    (row.finished_at - run.created_at).total_seconds(),
                    float(accuracy) if isinstance(accuracy, int | float) else None,
                    up,
                    down,
                    row.status,
                    counts.get(row.id, {}),
                )
            return curve
    finally:
        db.close()


# ---------------------------------------------------------------- Flower


def flower_round_s(
    links: Sequence[ClientLink], nbytes: int, clients: Iterable[Sequence[int]]
) -> float:
    """A synchronous round's duration by the link model: the slowest client's download
    of the model, its ``samples`` of compute and its upload (``clients``: pairs of
    partition id and samples trained)."""
    times = [links[pid].round_s(nbytes, nbytes, samples) for pid, samples in clients]
    if not times:
        raise ValueError("a round needs at least one client")
    return max(times)


def flower_curve(
    events: Sequence[Mapping[str, Any]], links: Sequence[ClientLink], nbytes: int
) -> Curve:
    """Flower's rounds on the link model's time line, from its ServerApp's events.

    Every sampled client downloads and uploads the whole float32 model (``nbytes``; the
    few hundred bytes of Flower's array framing are left out).
    """
    accuracy = {
        int(e["round"]): float(e["accuracy"]) for e in events if e.get("event") == "server_eval"
    }
    replies = sorted(
        (e for e in events if e.get("event") == "round_replies"), key=lambda e: int(e["round"])
    )
    curve, elapsed = Curve(), 0.0
    for event in replies:
        clients = [(int(pid), int(samples)) for pid, samples in event["clients"]]
        elapsed += flower_round_s(links, nbytes, clients)
        number = int(event["round"])
        moved = len(clients) * nbytes
        curve.add(number, elapsed, accuracy.get(number), moved, moved, fits={"ok": len(clients)})
    return curve


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines events written so far (a half-written last line is skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


def flower_pyproject(run_config: Mapping[str, int | float | str]) -> str:
    """The Flower app's ``pyproject.toml``: components in :mod:`benchmarks.wan_schedule_flower`."""
    config = "\n".join(f"{key} = {json.dumps(value)}" for key, value in run_config.items())
    return (
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "geoflwan"\nversion = "1.0.0"\n'
        'dependencies = ["flwr==1.42.0", "numpy"]\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["."]\n\n'
        '[tool.flwr.app]\npublisher = "geofl"\n\n'
        "[tool.flwr.app.components]\n"
        'serverapp = "benchmarks.wan_schedule_flower:server_app"\n'
        'clientapp = "benchmarks.wan_schedule_flower:client_app"\n\n'
        f"[tool.flwr.app.config]\n{config}\n"
    )


class _WanFlower(FlowerSimulationSystem):
    """Flower's simulation runtime (Ray, one CPU per virtual client) for this app."""

    def start(self, ctx: RunContext, run_config: Mapping[str, int | float | str]) -> None:
        app_dir = ctx.workdir / "app"
        app_dir.mkdir()
        (app_dir / "pyproject.toml").write_text(flower_pyproject(run_config))
        self._start_superlink(ctx)
        federation = (
            f"num-supernodes={run_config['num-clients']} client-resources-num-cpus=1 "
            "client-resources-num-gpus=0.0"
        )
        self._cli(ctx, ["run", str(app_dir), "bench", "--federation-config", federation])


def _stop_stragglers(samples: Sequence[ProcSample], launched: float) -> None:
    """Stop this run's processes that outlived their parent (Ray's daemons), by PID,
    only those created after the launch (a reused PID of someone else's is left alone)."""
    import psutil

    mine: list[int] = []
    for pid in sorted({s.pid for s in samples}):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).create_time() >= launched - 1.0:
                mine.append(pid)
    stop_trees(mine)


def _wait_for_done(ctx: RunContext, events: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e.get("event") == "done" for e in read_events(events)):
        ctx.check_alive()
        if time.monotonic() > deadline:
            raise BenchmarkError(f"Flower run not done within {timeout_s:.0f} s")
        time.sleep(_POLL_S)


def run_flower(
    workdir: Path, run_config: Mapping[str, int | float | str], timeout_s: float
) -> dict[str, Any]:
    """Run the Flower app to its end; its events, wall seconds, and an error if it failed.

    ``run_config`` is the app's configuration (:mod:`benchmarks.wan_schedule_flower`);
    its ``timing-file`` is set here. Every process started is stopped afterwards.
    """
    events = workdir / "events.jsonl"
    monitor = ProcessMonitor(_SAMPLE_S, _MAX_RSS_BYTES)
    port = free_port()
    ctx = RunContext(workdir, port, port, monitor)
    error: str | None = None
    monitor.start()
    launched, started = time.time(), time.monotonic()
    try:
        _WanFlower().start(ctx, {**run_config, "timing-file": str(events)})
        _wait_for_done(ctx, events, timeout_s)
    except (BenchmarkError, OSError) as exc:
        error = str(exc)
    finally:
        monitor.stop()
        ctx.stop_all()
        _stop_stragglers(monitor.samples, launched)
    record: dict[str, Any] = {
        "events": read_events(events),
        "wall_s": time.monotonic() - started,
        "peak_rss_total_mb": monitor.peak_total_rss / 1e6,
    }
    if error is not None:
        record["error"] = error
    return record
