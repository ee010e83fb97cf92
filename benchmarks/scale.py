"""Simulation at scale (issue 3): thousands of virtual clients, geofl against Flower 1.42.

Workload: a pool of ``--clients`` virtual clients (default 10,000), ``--per-round`` of them
(default 1,000) sampled each round, FedAvg, ``--rounds`` rounds, no federated evaluation.
Every client runs geofl's Fashion-MNIST MLP client
(:func:`examples.fashion_mnist.task.mlp_client_app`: ``local_steps`` SGD steps of
``batch_size`` samples drawn from its share, one torch thread) on an IID split of the
60,000 training images written once per case as a geofl partition file, so both
frameworks train the same code on the same data:

* **geofl**: ``geofl simulate`` on the virtual clock with ``--workers`` worker processes,
  run through the Python API (:func:`geofl.server.simulation.virtual.run_virtual_simulation`)
  in a child process (this module with ``--geofl-child``) that appends a timestamped
  JSON event per finished round; SQLite and checkpoints in the case's temporary directory.
  The generated ``run.yaml`` is the exact file ``geofl simulate -c`` accepts.
* **Flower**: a ``--simulation`` SuperLink (Ray backend) with ``--clients`` virtual
  SuperNodes, one CPU per client (so one Ray actor per core), and the app of
  :mod:`benchmarks.scale_flower` (stock FedAvg sampling ``per_round / clients`` of the
  nodes; its ClientApp wraps the same geofl client).

Per case: start-up seconds (launch until round 1 starts), seconds per round (wall, from
the events), steady seconds per round (median of rounds 2..R), time to result, peak total
RSS of every process the case started (sampled every 0.2 s, with a per-process-kind
breakdown at the peak), load averages, the final model's test accuracy. A memory brake
(``--max-rss-gb``) and a time limit stop a case and record how far it got. Each case holds
the shared heavy-work lock (:func:`benchmarks.core.heavy_lock`); the JSON is rewritten after
every case.

Run as ``python -m benchmarks.scale [--clients N] [--per-round K] [--rounds R]
[--repeats 3] [--flower-repeats 1] [--systems geofl,flower] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from benchmarks.compare import scrub_paths
from benchmarks.core import (
    REPO_ROOT,
    SERVER_GROUP,
    BenchmarkError,
    RunContext,
    free_port,
    heavy_lock,
    stop_trees,
)
from benchmarks.flower_system import FlowerSimulationSystem
from benchmarks.procmon import ProcessMonitor, ProcSample

__all__ = [
    "SYSTEMS",
    "ScaleSpec",
    "Timeline",
    "cpu_by_kind",
    "flower_pyproject",
    "flower_timeline",
    "geofl_run_config",
    "geofl_timeline",
    "main",
    "memory_at_peak",
    "read_events",
    "render_markdown",
    "run_case",
    "summarize",
    "write_partition",
]

#: Systems in the order they run within a repeat; ratios are Flower / geofl.
SYSTEMS = ("geofl", "flower")
SAMPLE_INTERVAL_S = 0.2
GIB = 2**30
#: The issue's targets: geofl at least this many times faster per steady round ...
SPEEDUP_TARGET = 3.0
#: ... in under this much memory.
RSS_TARGET_BYTES = 4 * GIB
_MB = 1e6
_POLL_S = 0.5
_LOG_TAIL_LINES = 15


@dataclass(frozen=True)
class ScaleSpec:
    """One workload, identical for both systems."""

    clients: int = 10_000
    per_round: int = 1_000
    min_clients: int = 500
    rounds: int = 5
    local_steps: int = 5
    batch_size: int = 16
    lr: float = 0.05
    workers: int = 2
    seed: int = 7
    timeout_s: float = 1200.0
    max_rss_gb: float = 18.0

    def __post_init__(self) -> None:
        if not 1 <= self.min_clients <= self.per_round <= self.clients:
            raise ValueError(
                "need 1 <= min_clients <= per_round <= clients, got "
                f"{self.min_clients}, {self.per_round}, {self.clients}"
            )
        for name in ("rounds", "local_steps", "batch_size", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or self.timeout_s <= 0 or self.max_rss_gb <= 0:
            raise ValueError("lr, timeout_s and max_rss_gb must be positive")


def write_partition(spec: ScaleSpec, directory: Path) -> Path:
    """Split the training images IID among ``spec.clients`` clients into a partition file.

    Seeded by ``spec.seed``; both systems' clients read their share from this file through
    :func:`geofl.client.partition.assigned_indices`.
    """
    from examples.fashion_mnist.task import train_labels
    from geofl.client.partition import write_partition_file
    from geofl.server.config.simulation import PartitionConfig
    from geofl.server.simulation.partition import partition_data

    parts = partition_data(
        PartitionConfig.model_validate({"iid": {}}), train_labels(), spec.clients, spec.seed
    )
    path = directory / "partition.npz"
    write_partition_file(path, parts)
    return path


def _round_config(spec: ScaleSpec) -> dict[str, int | float]:
    return {"local_steps": spec.local_steps, "batch_size": spec.batch_size, "lr": spec.lr}


def geofl_run_config(spec: ScaleSpec, workdir: Path, partition_file: Path) -> dict[str, Any]:
    """The ``geofl simulate`` run file of the workload (a mapping to dump as YAML)."""
    return {
        "run": {"name": "scale", "rounds": spec.rounds, "seed": spec.seed},
        "model": "examples.fashion_mnist.task:make_mlp_model",
        "strategy": {
            "name": "fedavg",
            "clients_per_round": spec.per_round,
            "min_clients": spec.min_clients,
        },
        "schedule": {"deadline_s": spec.timeout_s, "wait_for_clients_s": spec.timeout_s},
        "round_config": _round_config(spec),
        "evaluation": {"every": 0},
        "storage": {
            "url": f"sqlite:///{workdir / 'scale.db'}",
            "checkpoints": str(workdir / "checkpoints"),
            "keep_checkpoints": 1,
        },
        "simulation": {
            "clients": spec.clients,
            "clock": "virtual",
            "workers": spec.workers,
            "app": "examples.fashion_mnist.task:mlp_client_app",
            "node_config": {"partition-file": str(partition_file), "torch-threads": 1},
        },
    }


def flower_pyproject(spec: ScaleSpec, timing_file: Path, partition_file: Path) -> str:
    """The Flower app's ``pyproject.toml``: components in :mod:`benchmarks.scale_flower`."""
    values: dict[str, int | float | str] = {
        "num-clients": spec.clients,
        "per-round": spec.per_round,
        "min-clients": spec.min_clients,
        "num-rounds": spec.rounds,
        **{key.replace("_", "-"): value for key, value in _round_config(spec).items()},
        "partition-file": str(partition_file),
        "timing-file": str(timing_file),
    }
    config = "\n".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return (
        '[build-system]\nrequires = ["hatchling"]\nbuild-backend = "hatchling.build"\n\n'
        '[project]\nname = "geoflscale"\nversion = "1.0.0"\n'
        'dependencies = ["flwr==1.42.0", "numpy"]\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["."]\n\n'
        '[tool.flwr.app]\npublisher = "geofl"\n\n'
        "[tool.flwr.app.components]\n"
        'serverapp = "benchmarks.scale_flower:server_app"\n'
        'clientapp = "benchmarks.scale_flower:client_app"\n\n'
        f"[tool.flwr.app.config]\n{config}\n"
    )


# ---------------------------------------------------------------- events -> timeline


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines events written so far (a half-written last line is skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


@dataclass
class Timeline:
    """What the events say: start-up, finished rounds, time to result, accuracy.

    ``round_s[i]`` is round ``i + 1``'s wall seconds; a run that stopped early has fewer.
    ``tasks_ok`` is the updates each finished round aggregated.
    """

    startup_s: float | None = None
    round_s: list[float] = field(default_factory=list)
    tasks_ok: list[int] = field(default_factory=list)
    result_s: float | None = None
    accuracy: float | None = None
    done: bool = False
    last_event: str | None = None


def _times(events: Sequence[Mapping[str, Any]], name: str) -> list[float]:
    return [float(e["t"]) for e in events if e.get("event") == name]


def _accuracy(events: Sequence[Mapping[str, Any]]) -> float | None:
    done = [e for e in events if e.get("event") == "done"]
    value = done[-1].get("accuracy") if done else None
    return float(value) if isinstance(value, int | float) and value >= 0 else None


def _last_event(events: Sequence[Mapping[str, Any]]) -> str | None:
    if not events:
        return None
    last = events[-1]
    return f"{last.get('event')}" + (f" (round {last['round']})" if "round" in last else "")


def geofl_timeline(events: Sequence[Mapping[str, Any]], launched: float) -> Timeline:
    """geofl: start-up = launch -> ``fleet_ready``; round r ends at its ``round_end`` and
    starts where round r - 1 ended (round 1 at ``fleet_ready``)."""
    ready, ends = _times(events, "fleet_ready"), _times(events, "round_end")
    line = Timeline(accuracy=_accuracy(events), last_event=_last_event(events))
    line.done = any(e.get("event") == "done" for e in events)
    if not ready:
        return line
    line.startup_s = ready[0] - launched
    bounds = [ready[0], *ends]
    line.round_s = [b - a for a, b in itertools.pairwise(bounds)]
    line.tasks_ok = [int(e.get("ok", 0)) for e in events if e.get("event") == "round_end"]
    finished = _times(events, "rounds_done")
    line.result_s = finished[0] - launched if finished else None
    return line


def flower_timeline(events: Sequence[Mapping[str, Any]], launched: float) -> Timeline:
    """Flower: start-up = launch -> round 1's ``round_start``; round r runs from its
    ``round_start`` to round r + 1's (the last to ``rounds_done``); a round counts as
    finished once it has aggregated (``round_replies``)."""
    starts = _times(events, "round_start")
    line = Timeline(accuracy=_accuracy(events), last_event=_last_event(events))
    line.done = any(e.get("event") == "done" for e in events)
    if not starts:
        return line
    line.startup_s = starts[0] - launched
    finished = _times(events, "rounds_done")
    bounds = starts + finished[:1]
    line.round_s = [b - a for a, b in itertools.pairwise(bounds)]
    replies = [e for e in events if e.get("event") == "round_replies"]
    line.tasks_ok = [int(e.get("replies", 0)) - int(e.get("errors", 0)) for e in replies]
    line.result_s = finished[0] - launched if finished else None
    return line


# ---------------------------------------------------------------- memory


def memory_at_peak(
    samples: Sequence[ProcSample], kind_of: Callable[[ProcSample], str]
) -> dict[str, Any]:
    """Peak of the summed RSS over all processes, and what made it up at that instant."""
    by_time: dict[float, list[ProcSample]] = {}
    for sample in samples:
        by_time.setdefault(sample.t, []).append(sample)
    if not by_time:
        return {"peak_rss_total_mb": None, "peak_rss_by_kind_mb": {}, "processes_at_peak": 0}
    instant = max(by_time, key=lambda t: sum(s.rss for s in by_time[t]))
    kinds: dict[str, float] = {}
    for sample in by_time[instant]:
        kinds[kind_of(sample)] = kinds.get(kind_of(sample), 0.0) + sample.rss / _MB
    return {
        "peak_rss_total_mb": sum(kinds.values()),
        "peak_rss_by_kind_mb": dict(sorted(kinds.items())),
        "processes_at_peak": len(by_time[instant]),
    }


# ---------------------------------------------------------------- running one case


def _python_env() -> dict[str, str]:
    """The repository on ``PYTHONPATH`` (cases run in a temporary directory)."""
    paths = [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _start_geofl(spec: ScaleSpec, ctx: RunContext, partition: Path, events: Path) -> None:
    config = ctx.workdir / "run.yaml"
    config.write_text(yaml.safe_dump(geofl_run_config(spec, ctx.workdir, partition)))
    argv = [sys.executable, "-m", "benchmarks.scale", "--geofl-child", str(config), str(events)]
    ctx.spawn(SERVER_GROUP, "geofl-simulate", argv, _python_env())


class _ScaleFlower(FlowerSimulationSystem):
    """Flower's simulation runtime for the scale app (reuses the SuperLink and CLI steps)."""

    def start(self, spec: ScaleSpec, ctx: RunContext, partition: Path, events: Path) -> None:
        app_dir = ctx.workdir / "app"
        app_dir.mkdir()
        (app_dir / "pyproject.toml").write_text(flower_pyproject(spec, events, partition))
        self._start_superlink(ctx)
        federation = (
            f"num-supernodes={spec.clients} client-resources-num-cpus=1 "
            "client-resources-num-gpus=0.0"
        )
        args = ["run", str(app_dir), "bench", "--format", "json"]
        self._cli(ctx, [*args, "--federation-config", federation])


@dataclass
class _HostReadings:
    """What the poll loop reads besides the events: the 1-minute load average, and the
    CPU seconds (user + system) of every process in the case's trees, by PID (the last
    reading of a process that exited between polls is kept: at most one poll is lost)."""

    loads: list[float] = field(default_factory=list)
    cpu_s: dict[int, float] = field(default_factory=dict)

    def read(self, roots: Sequence[int]) -> None:
        """Take one reading of the load and of the trees under ``roots``."""
        self.loads.append(os.getloadavg()[0])
        for root in roots:
            with contextlib.suppress(psutil.Error):
                top = psutil.Process(root)
                for proc in [top, *top.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        times = proc.cpu_times()
                        self.cpu_s[proc.pid] = times.user + times.system


def _wait_until_done(
    ctx: RunContext, events: Path, timeout_s: float, readings: _HostReadings
) -> None:
    """Poll the events until ``done``; fail on a dead process, the brake or the time limit."""
    deadline = time.monotonic() + timeout_s
    while not any(e.get("event") == "done" for e in read_events(events)):
        ctx.check_alive()
        if ctx.procs and all(proc.poll() is not None for proc in ctx.procs):
            raise BenchmarkError("the run's processes exited before it reported 'done'")
        if time.monotonic() > deadline:
            raise BenchmarkError(f"time limit: not done within {timeout_s:.0f} s")
        readings.read([proc.pid for proc in ctx.procs])
        time.sleep(_POLL_S)


def cpu_by_kind(
    cpu_s: Mapping[int, float], samples: Sequence[ProcSample], kind_of: Callable[[ProcSample], str]
) -> dict[str, float]:
    """CPU seconds summed per process kind (a PID the memory sampler never saw: ``other``)."""
    kinds = {sample.pid: kind_of(sample) for sample in samples}
    totals: dict[str, float] = {}
    for pid, seconds in cpu_s.items():
        kind = kinds.get(pid, "other")
        totals[kind] = totals.get(kind, 0.0) + seconds
    return dict(sorted(totals.items()))


def _stop_stragglers(samples: Sequence[ProcSample], launched: float) -> None:
    """Stop processes of this case that outlived their parent (e.g. a Ray daemon).

    Only PIDs sampled in this case's trees, still alive and created after its launch
    (so a reused PID of someone else's process is left alone).
    """
    mine: list[int] = []
    for pid in sorted({s.pid for s in samples}):
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).create_time() >= launched - 1.0:
                mine.append(pid)
    stop_trees(mine)


def _log_tails(workdir: Path) -> dict[str, list[str]]:
    """The last lines of each process log: where a failed run stopped, in its own words."""
    tails = {}
    for log in sorted((workdir / "logs").glob("*.log")):
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        tails[log.name] = lines[-_LOG_TAIL_LINES:]
    return tails


def _kind_of(system: str, root_pid: int | None) -> Callable[[ProcSample], str]:
    if system == "geofl":
        # The children are the workers plus multiprocessing's small resource tracker.
        return lambda s: "geofl simulate (server)" if s.pid == root_pid else "geofl children"
    return lambda s: s.kind


def _per_process_peaks(
    samples: Sequence[ProcSample], kind_of: Callable[[ProcSample], str]
) -> dict[str, float]:
    """The largest single process of each kind over the run (MB)."""
    peaks: dict[str, float] = {}
    for sample in samples:
        kind = kind_of(sample)
        peaks[kind] = max(peaks.get(kind, 0.0), sample.rss / _MB)
    return dict(sorted(peaks.items()))


def _case_record(system: str, spec: ScaleSpec, line: Timeline, error: str | None) -> dict[str, Any]:
    complete = error is None and line.done and len(line.round_s) == spec.rounds
    record: dict[str, Any] = {
        "system": system,
        "ok": complete,
        "error": error,
        "startup_s": line.startup_s,
        "round_s": line.round_s,
        "round1_s": line.round_s[0] if line.round_s else None,
        "steady_round_s": statistics.median(line.round_s[1:]) if len(line.round_s) > 1 else None,
        "rounds_finished": len(line.round_s),
        "tasks_ok_per_round": line.tasks_ok,
        "result_s": line.result_s,
        "accuracy": line.accuracy,
    }
    if not complete:
        record["stopped_at"] = (
            f"after {len(line.round_s)} of {spec.rounds} rounds; last event: {line.last_event}"
        )
    return record


def run_case(system: str, spec: ScaleSpec, keep_workdir: bool = False) -> dict[str, Any]:
    """Run one system on the workload, measure it, always clean up; return its record."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; expected one of {SYSTEMS}")
    workdir = Path(tempfile.mkdtemp(prefix=f"scale-{system}-"))
    monitor = ProcessMonitor(SAMPLE_INTERVAL_S, int(spec.max_rss_gb * 1e9))
    port = free_port()
    ctx = RunContext(workdir, port, port, monitor)
    events = workdir / "events.jsonl"
    partition = write_partition(spec, workdir)
    load_before, readings = os.getloadavg(), _HostReadings()
    error: str | None = None
    monitor.start()
    launched, started = time.time(), time.monotonic()
    try:
        if system == "geofl":
            _start_geofl(spec, ctx, partition, events)
        else:
            _ScaleFlower().start(spec, ctx, partition, events)
        _wait_until_done(ctx, events, spec.timeout_s, readings)
    except (BenchmarkError, OSError, subprocess.SubprocessError) as exc:
        error = str(exc)
    finally:
        monitor.stop()
        ctx.stop_all()
        _stop_stragglers(monitor.samples, launched)
    wall_s = time.monotonic() - started
    line = (geofl_timeline if system == "geofl" else flower_timeline)(read_events(events), launched)
    record = _case_record(system, spec, line, error)
    kind_of = _kind_of(system, ctx.procs[0].pid if ctx.procs else None)
    record |= memory_at_peak(monitor.samples, kind_of)
    record["peak_rss_single_process_mb"] = _per_process_peaks(monitor.samples, kind_of)
    record["cpu_s_by_kind"] = cpu_by_kind(readings.cpu_s, monitor.samples, kind_of)
    record["cpu_s_total"] = sum(readings.cpu_s.values())
    record["wall_s"] = wall_s
    record["load_before"] = list(load_before)
    record["load_after"] = list(os.getloadavg())
    loads = readings.loads
    record["load1_during"] = {
        "mean": statistics.fmean(loads) if loads else None,
        "max": max(loads, default=None),
    }
    if not record["ok"]:
        record["log_tail"] = _log_tails(workdir)
    record["workdir"] = str(workdir) if keep_workdir or not record["ok"] else None
    if record["workdir"] is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return record


# ---------------------------------------------------------------- summary

#: Per-system summary fields: medians over the complete runs.
_SUMMARY_KEYS = (
    "startup_s",
    "round1_s",
    "steady_round_s",
    "result_s",
    "peak_rss_total_mb",
    "cpu_s_total",
)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _system_summary(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over complete runs; with none, over the runs that finished >= 2 rounds.

    The fallback is flagged (``from_incomplete_runs``): a system that never completes the
    workload still has a per-round speed up to where it stopped.
    """
    complete = [c for c in cases if c["ok"]]
    chosen = complete or [c for c in cases if c.get("steady_round_s") is not None]
    row: dict[str, Any] = {"runs": len(cases), "complete": len(complete)}
    row |= {key: _median([c.get(key) for c in chosen]) for key in _SUMMARY_KEYS}
    row["max_peak_rss_total_mb"] = max(
        (c["peak_rss_total_mb"] for c in cases if c.get("peak_rss_total_mb") is not None),
        default=None,
    )
    row["accuracy"] = _median([c.get("accuracy") for c in complete])
    row["from_incomplete_runs"] = not complete and bool(chosen)
    return row


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return numerator / denominator if numerator is not None and denominator else None


def summarize(cases: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-system medians, Flower / geofl ratios, and the issue's targets.

    Targets: geofl completes; its steady round is at least :data:`SPEEDUP_TARGET` times
    faster than Flower's; its largest peak total RSS over the runs is under
    :data:`RSS_TARGET_BYTES`. A target that cannot be judged (no number) is None.
    """
    systems = {
        name: _system_summary([c for c in cases if c["system"] == name])
        for name in SYSTEMS
        if any(c["system"] == name for c in cases)
    }
    geofl, flower = systems.get("geofl", {}), systems.get("flower", {})
    ratios = {key: _ratio(flower.get(key), geofl.get(key)) for key in _SUMMARY_KEYS}
    speedup, peak = ratios["steady_round_s"], geofl.get("max_peak_rss_total_mb")
    targets = {
        "geofl_completes": bool(geofl.get("complete")) if geofl else None,
        "speedup_at_least_3x": None if speedup is None else speedup >= SPEEDUP_TARGET,
        "geofl_under_4_gib": None if peak is None else peak * _MB < RSS_TARGET_BYTES,
    }
    return {"systems": systems, "flower_over_geofl": ratios, "targets": targets}


def _fmt(value: object, spec: str) -> str:
    if value is None:
        return "\u2013"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def render_markdown(report: Mapping[str, Any]) -> str:
    """The summary table, the ratios and targets, and one line per run."""
    spec, summary = report["spec"], report["summary"]
    lines = [
        f"**{spec['clients']:,} clients, {spec['per_round']:,} per round, {spec['rounds']} "
        f"rounds**, MLP {spec['local_steps']} steps x {spec['batch_size']}, "
        f"{spec['workers']} workers / actors",
        "",
        "| system | complete | start-up s | round 1 s | steady s/round | time to result s "
        "| peak RSS all MB | CPU s (whole run) | accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in summary["systems"].items():
        note = " (incomplete runs)" if row["from_incomplete_runs"] else ""
        cells = [
            f"{name}{note}",
            f"{row['complete']}/{row['runs']}",
            _fmt(row["startup_s"], ".1f"),
            _fmt(row["round1_s"], ".2f"),
            _fmt(row["steady_round_s"], ".3f"),
            _fmt(row["result_s"], ".1f"),
            _fmt(row["peak_rss_total_mb"], ".0f"),
            _fmt(row["cpu_s_total"], ".0f"),
            _fmt(row["accuracy"], ".4f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ratios = summary["flower_over_geofl"]
    lines += [
        "",
        "Flower / geofl: "
        + ", ".join(f"{key} {_fmt(value, '.2f')}" for key, value in ratios.items()),
        "Targets: " + ", ".join(f"{key} {value}" for key, value in summary["targets"].items()),
        "",
    ]
    for case in report["cases"]:
        rounds = " ".join(f"{t:.2f}" for t in case["round_s"])
        load = case["load1_during"]
        cpu = ", ".join(f"{k} {v:.0f}" for k, v in case.get("cpu_s_by_kind", {}).items())
        lines.append(
            f"- {case['system']} run {case['repeat'] + 1}: ok={case['ok']} rounds [{rounds}] "
            f"peak {_fmt(case['peak_rss_total_mb'], '.0f')} MB, load {_fmt(load['mean'], '.1f')}"
            f", CPU s {_fmt(case.get('cpu_s_total'), '.0f')} ({cpu})"
            + (f"; {case.get('stopped_at')}: {case['error']}" if not case["ok"] else "")
        )
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the geofl child


def _append_event(path: Path, event: str, **fields: float | int | str | None) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")


def _final_accuracy(config_path: Path, run_id: int) -> float | None:
    """Test accuracy of the run's last checkpoint (outside the timed rounds)."""
    from examples.fashion_mnist.task import mlp_server_evaluate
    from geofl.server.config import load_config
    from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

    config = load_config(config_path)
    database = open_database(config.storage.url, migrate=False)
    with database.session() as session:
        row = queries.latest_checkpoint(session, run_id)
        if row is None:
            return None
        record = CheckpointRecord.from_row(row)
    weights, _state = CheckpointStore(Path(config.storage.checkpoints)).load(record)
    _loss, metrics = mlp_server_evaluate(weights)
    accuracy = metrics.get("accuracy")
    return float(accuracy) if isinstance(accuracy, int | float) else None


def run_geofl_child(config_path: Path, events: Path) -> int:
    """``geofl simulate -c config_path`` on the virtual clock, logging events; exit code."""
    from geofl.server.config import load_config
    from geofl.server.rounds.observers import RoundEndCallback
    from geofl.server.simulation.preflight import check_simulation
    from geofl.server.simulation.virtual import run_virtual_simulation

    _append_event(events, "child_start")
    config = load_config(config_path)
    traces = check_simulation(config, str(config_path))

    def on_round_end(record: Any, status: str) -> None:
        ok = sum(1 for _, outcome in record.outcomes if outcome.status == "ok")
        _append_event(events, "round_end", round=record.number, status=status, ok=ok)

    run = run_virtual_simulation(
        config,
        traces,
        observers=[RoundEndCallback(on_round_end)],
        on_start=lambda coordinator, links: _append_event(events, "fleet_ready"),
    )
    status = run.result.status
    _append_event(events, "rounds_done", status=status, simulated_s=run.simulated_s)
    if status != "completed":
        print(f"geofl run {status}: {run.result.error}", file=sys.stderr)
        return 1
    _append_event(events, "done", accuracy=_final_accuracy(config_path, run.result.run_id))
    return 0


# ---------------------------------------------------------------- command line


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="geofl vs Flower 1.42 at simulation scale")
    defaults = ScaleSpec()
    parser.add_argument("--clients", type=int, default=defaults.clients, help="pool size")
    parser.add_argument("--per-round", type=int, default=defaults.per_round)
    parser.add_argument("--min-clients", type=int, default=defaults.min_clients)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--local-steps", type=int, default=defaults.local_steps)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--workers", type=int, default=defaults.workers, help="geofl workers")
    parser.add_argument("--repeats", type=int, default=3, help="geofl runs")
    parser.add_argument("--flower-repeats", type=int, default=1, help="Flower runs")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="geofl,flower")
    parser.add_argument("--timeout", type=float, default=defaults.timeout_s, help="s per run")
    parser.add_argument("--max-rss-gb", type=float, default=defaults.max_rss_gb)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "benchmarks/results/scale.json")
    parser.add_argument("--keep-workdirs", action="store_true")
    parser.add_argument("--no-lock", action="store_true", help="already under flock")
    parser.add_argument("--geofl-child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        parser.error(f"unknown --systems {unknown}; expected some of {SYSTEMS}")
    if args.repeats < 1 or args.flower_repeats < 1:
        parser.error("--repeats and --flower-repeats must be >= 1")
    if args.rounds < 2:
        parser.error("--rounds must be >= 2: round 1 carries start-up, steady rounds are 2..R")
    return args


def _spec(args: argparse.Namespace) -> ScaleSpec:
    return ScaleSpec(
        clients=args.clients,
        per_round=args.per_round,
        min_clients=min(args.min_clients, args.per_round),
        rounds=args.rounds,
        local_steps=args.local_steps,
        batch_size=args.batch_size,
        workers=args.workers,
        timeout_s=args.timeout,
        max_rss_gb=args.max_rss_gb,
    )


def run_benchmark(
    spec: ScaleSpec,
    repeats: Mapping[str, int],
    on_case: Callable[[list[dict[str, Any]]], None] = lambda cases: None,
    lock: bool = True,
    keep_workdirs: bool = False,
) -> list[dict[str, Any]]:
    """Alternate the systems, repeat ``i`` of each while it has repeats left.

    ``lock``: hold the heavy-work lock during each run (never across runs, so other
    people's work can go in between).
    """
    cases: list[dict[str, Any]] = []
    for repeat in range(max(repeats.values())):
        for system in (s for s in SYSTEMS if repeat < repeats.get(s, 0)):
            with heavy_lock() if lock else contextlib.nullcontext():
                record = run_case(system, spec, keep_workdirs)
            cases.append({**record, "repeat": repeat})
            on_case(cases)
    return cases


def build_report(spec: ScaleSpec, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON document: workload, host, every run (paths scrubbed), the summary."""
    return {
        "benchmark": "scale",
        "created_unix": time.time(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "spec": asdict(spec),
        "cases": scrub_paths(cases),
        "summary": summarize(cases),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--geofl-child``, one geofl simulation)."""
    args = _parse_args(argv)
    if args.geofl_child is not None:
        return run_geofl_child(*args.geofl_child)
    try:
        spec = _spec(args)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    counts = {"geofl": args.repeats, "flower": args.flower_repeats}
    repeats = {s: counts[s] for s in args.systems}

    def save(cases: list[dict[str, Any]]) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(build_report(spec, cases), indent=2) + "\n")
        last = cases[-1]
        print(
            f"{last['system']} run {last['repeat'] + 1}: ok={last['ok']} "
            f"rounds={[round(t, 2) for t in last['round_s']]} {last.get('error') or ''}",
            flush=True,
        )

    cases = run_benchmark(
        spec, repeats, save, lock=not args.no_lock, keep_workdirs=args.keep_workdirs
    )
    print(render_markdown(build_report(spec, cases)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
