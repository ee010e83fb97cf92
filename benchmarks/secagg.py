"""Secure-aggregation cost: SecAgg+ against plain aggregation, per system (issue 7).

Workload: ``n`` clients that return the received model plus a small client-specific
constant (no training), a float32 model of ``d`` parameters, ``rounds`` rounds, FedAvg over
all clients, optionally a fraction of clients dropping out in a chosen protocol stage. Each
case is one system, one mode (``simulation`` or ``deployment``), secure or plain.

The record is the same for every system (:class:`SecAggRecord`): seconds per steady round
(median over rounds 2..R), bytes per client per round (payload as the system counts it;
on the wire too where a byte proxy could sit in front of the server), peak RSS of all the
system's processes, and a correctness check of the final model. A system plugs in as a
:class:`SecAggSystem` in :data:`SYSTEMS`.

Usage::

    python -m benchmarks.secagg --system flower --mode simulation --clients 10,50 \\
        --params 100000,1000000 --dropout 0,0.1 --secure both --rounds 6 \\
        --out benchmarks/results/secagg_flower.json

Every case holds ``geofl-heavy.lock`` in the temporary directory (the lock ``flock(1)``
takes) while it runs, unless ``--no-lock`` says the caller holds it for the whole command
(``flock LOCKFILE python -m benchmarks.secagg --no-lock ...``); the JSON is rewritten after
every case.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from benchmarks.core import (
    REPO_ROOT,
    SERVER_GROUP,
    BenchmarkError,
    RunContext,
    console_script,
    free_port,
    stop_tree,
    wait_for_port,
)
from benchmarks.flower_system import cli_config_toml, traffic_from_ls
from benchmarks.harness import read_byte_samples
from benchmarks.metrics import ByteSample, bytes_between
from benchmarks.procmon import ProcessMonitor, classify_cmdline

__all__ = [
    "FLOWER_SECAGG_APP",
    "LOCK",
    "MODES",
    "SYSTEMS",
    "FlowerSecAgg",
    "KindNamer",
    "RoundMeasure",
    "SecAggCase",
    "SecAggRecord",
    "SecAggRun",
    "SecAggSystem",
    "build_cases",
    "flower_run_config",
    "flower_run_from_events",
    "heavy_lock",
    "main",
    "make_record",
    "merge_cases",
    "parse_args",
    "process_kind",
    "run_secagg_case",
    "shift_tolerance",
    "steady",
    "steady_completed",
]

MODES = ("simulation", "deployment")
LOCK = Path(tempfile.gettempdir()) / "geofl-heavy.lock"
_MB = 1e6


@dataclass(frozen=True)
class SecAggCase:
    """One measured configuration.

    Attributes
    ----------
    n, d
        Clients (all take part in every round) and float32 model parameters.
    rounds
        Rounds; the steady figure is the median of rounds 2..R (round 1 includes start-up).
    secure
        SecAgg+ (True) or plain aggregation over the same code path (False).
    dropout
        Fraction of clients that drop out in each round (a fresh seeded draw per round).
    mode
        ``"simulation"`` (one process tree, clients simulated) or ``"deployment"``
        (server and client processes on 127.0.0.1).
    num_shares, threshold
        SecAgg+ neighbourhood size and the shares needed to reconstruct a secret.
    drop_stage
        The protocol stage in which dropped clients fail (system-specific names).
    drop_seed
        Seed of the per-round draw of dropped clients.
    timeout_s
        Wall-clock limit for the case, start-up included.
    """

    n: int
    d: int
    rounds: int
    secure: bool
    dropout: float = 0.0
    mode: str = "simulation"
    num_shares: int = 5
    threshold: int = 3
    drop_stage: str = ""
    drop_seed: int = 0
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.n < 2 or self.d < 1 or self.rounds < 1:
            raise ValueError(f"need n >= 2, d >= 1, rounds >= 1; got {self}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not 2 <= self.threshold < self.num_shares:
            raise ValueError(
                f"need 2 <= threshold < num_shares, got {self.threshold} / {self.num_shares}"
            )


@dataclass(frozen=True)
class RoundMeasure:
    """One round as the system reports it.

    ``aggregated`` is the number of clients whose updates entered the model (0 when the
    protocol gave up on the round). Byte figures are per client (divided by ``n``).
    """

    number: int
    duration_s: float
    start_wall: float
    aggregated: int
    payload_up_bytes: float | None = None
    payload_down_bytes: float | None = None


@dataclass
class SecAggRun:
    """What a system returns after a completed case."""

    rounds: list[RoundMeasure]
    final_shift: float | None
    expected_shift: float | None
    max_abs_error: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class SecAggRecord:
    """The common result of one case (times in s, bytes per client per round, RSS in MB).

    ``steady_round_s`` is the median over rounds 2..R; ``steady_completed_round_s`` the same
    over those of them that aggregated (a round the protocol gave up on ends early).

    ``payload_*_bytes`` are what the system itself counts as message content (no framing),
    ``wire_*_bytes`` what the byte proxy saw (deployment only: every byte, polls included).
    ``peak_rss_mb`` is the peak of the summed RSS of every process of the case at one
    sample; ``peak_rss_server_mb`` / ``peak_rss_site_mb`` the same for the server side and
    for the largest client site (a simulation has only a server side); ``rss_by_kind_mb``
    sums the processes of each kind (e.g. all Ray processes, all SuperNodes).
    """

    system: str
    mode: str
    n: int
    d: int
    dropout: float
    secure: bool
    rounds: int
    ok: bool
    error: str | None = None
    round_s: list[float] = field(default_factory=list)
    steady_round_s: float | None = None
    steady_completed_round_s: float | None = None
    aggregated_per_round: list[int] = field(default_factory=list)
    halted_rounds: list[int] = field(default_factory=list)
    payload_up_bytes: float | None = None
    payload_down_bytes: float | None = None
    wire_up_bytes: float | None = None
    wire_down_bytes: float | None = None
    peak_rss_mb: float | None = None
    peak_rss_server_mb: float | None = None
    peak_rss_site_mb: float | None = None
    rss_by_kind_mb: dict[str, float] = field(default_factory=dict)
    final_shift: float | None = None
    expected_shift: float | None = None
    max_abs_error: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    wall_s: float | None = None
    load_before: list[float] = field(default_factory=list)
    load_after: list[float] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class SecAggSystem(ABC):
    """A framework that can run :class:`SecAggCase` s.

    The harness gives it a :class:`RunContext` (fresh work directory, ports, memory
    monitor); in deployment mode a byte proxy forwards ``ctx.client_port`` to
    ``ctx.server_port``, so clients must dial ``client_port``.
    """

    name: str = ""
    #: Modes the system supports, a subset of :data:`MODES`.
    modes: tuple[str, ...] = ()

    def default_drop_stage(self, secure: bool) -> str:
        """The stage dropped clients fail in when the case names none."""
        return "train"

    @abstractmethod
    def run(self, case: SecAggCase, ctx: RunContext) -> SecAggRun:
        """Deploy, run all rounds, return measurements; raise BenchmarkError on failure.

        Start every process through ``ctx.spawn`` (group ``"server"`` or ``"site-<i>"``)
        so that it is measured and stopped by the harness.
        """


def steady(values: Sequence[float | None]) -> float | None:
    """Median of rounds 2..R (round 1 when there is only one); None if nothing is known."""
    tail = [v for v in (values[1:] if len(values) > 1 else values) if v is not None]
    return statistics.median(tail) if tail else None


def steady_completed(rounds: Sequence[RoundMeasure]) -> float | None:
    """Median over rounds 2..R that aggregated something (a halted round ends early)."""
    tail = rounds[1:] if len(rounds) > 1 else rounds
    done = [r.duration_s for r in tail if r.aggregated > 0]
    return statistics.median(done) if done else None


def shift_tolerance(case: SecAggCase) -> float:
    """How far the final mean shift may be from the expected one before a case fails.

    Plain aggregation is float32-exact up to rounding. SecAgg+ quantizes stochastically: at
    Flower's defaults (clip 8, 2^22 levels, weight 1/1000) one parameter of one client
    carries unbiased noise of standard deviation up to ~0.002, so the mean over ``n * d``
    values and R rounds has sigma ~0.002 * sqrt(R / (n d)); six sigma are allowed. Losing
    one client's update moves the mean by at least (mean constant - 0.001) / (n - 1) per
    round, more than that for every n >= 3 at d >= 1000.
    """
    plain = 1e-5
    if not case.secure:
        return plain
    return plain + 6 * 0.002 * math.sqrt(case.rounds / (case.n * case.d))


def process_kind(cmdline: Sequence[str]) -> str:
    """The harness's process kinds plus the simulation runtime and Ray's processes."""
    text = " ".join(cmdline)
    if "flwr-simulation" in text:
        return "simulation"
    if "/ray/" in text or text.startswith("ray::"):  # Ray's binaries, scripts and workers
        return "ray"
    return classify_cmdline(cmdline)


class KindNamer:
    """Names the kind of every process the harness's monitor sampled (see :func:`process_kind`).

    The :class:`ProcessMonitor` keeps RSS samples, totals and the memory brake, but files
    Flower's simulation runtime and Ray's processes under ``"other"``. This thread reads the
    command line of each new PID once, while the process is alive, so that the samples can
    be regrouped afterwards (:meth:`peaks`).
    """

    def __init__(self, monitor: ProcessMonitor, interval_s: float = 0.5) -> None:
        self._monitor = monitor
        self._interval_s = interval_s
        self.kinds: dict[int, str] = {}
        self._seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kind-namer", daemon=True)

    def start(self) -> None:
        """Start naming."""
        self._thread.start()

    def stop(self) -> None:
        """Stop naming (call before the processes are stopped)."""
        self._stop.set()
        self._thread.join()
        self._name_new()

    def peaks(self) -> dict[str, float]:
        """Per kind, the largest summed RSS of its processes at one sampling instant (MB)."""
        sums: dict[tuple[str, float], int] = {}
        for s in self._monitor.samples:
            key = (self.kinds.get(s.pid, s.kind), s.t)
            sums[key] = sums.get(key, 0) + s.rss
        out: dict[str, float] = {}
        for (kind, _), total in sums.items():
            out[kind] = max(out.get(kind, 0.0), total / _MB)
        return dict(sorted(out.items()))

    def _name_new(self) -> None:
        samples = self._monitor.samples
        end = len(samples)
        for s in samples[self._seen : end]:
            if s.pid in self.kinds:
                continue
            try:
                self.kinds[s.pid] = process_kind(psutil.Process(s.pid).cmdline())
            except psutil.Error:
                self.kinds[s.pid] = s.kind
        self._seen = end

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._name_new()


@contextmanager
def heavy_lock() -> Iterator[None]:
    """Hold the shared heavy-work lock (the same flock(2) lock as ``flock(1)``)."""
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ------------------------------------------------------------------ one case, any system


def _per_client_bytes(
    samples: Sequence[ByteSample], rounds: Sequence[RoundMeasure], n: int
) -> list[tuple[float, float]]:
    """Proxy bytes (up, down) per client in each round's [start, start + duration]."""
    out = []
    for r in rounds:
        up, down = bytes_between(samples, r.start_wall, r.start_wall + r.duration_s)
        out.append((up / n, down / n))
    return out


def make_record(
    system: str, case: SecAggCase, run: SecAggRun, samples: Sequence[ByteSample]
) -> SecAggRecord:
    """The common record of a completed case; ``ok`` also checks the final model."""
    rounds = run.rounds
    record = SecAggRecord(
        system=system,
        mode=case.mode,
        n=case.n,
        d=case.d,
        dropout=case.dropout,
        secure=case.secure,
        rounds=case.rounds,
        ok=True,
        round_s=[r.duration_s for r in rounds],
        steady_round_s=steady([r.duration_s for r in rounds]),
        steady_completed_round_s=steady_completed(rounds),
        aggregated_per_round=[r.aggregated for r in rounds],
        halted_rounds=[r.number for r in rounds if r.aggregated == 0],
        payload_up_bytes=steady([r.payload_up_bytes for r in rounds]),
        payload_down_bytes=steady([r.payload_down_bytes for r in rounds]),
        final_shift=run.final_shift,
        expected_shift=run.expected_shift,
        max_abs_error=run.max_abs_error,
        notes=dict(run.notes),
    )
    if samples:
        wire = _per_client_bytes(samples, rounds, case.n)
        record.wire_up_bytes = steady([u for u, _ in wire])
        record.wire_down_bytes = steady([d for _, d in wire])
        record.notes["wire_bytes_per_client_by_round"] = [list(w) for w in wire]
    if len(rounds) != case.rounds:
        record.ok, record.error = False, f"{len(rounds)} of {case.rounds} rounds reported"
    elif run.final_shift is None or run.expected_shift is None:
        record.ok, record.error = False, "the system reported no final model shift"
    elif abs(run.final_shift - run.expected_shift) > shift_tolerance(case):
        record.ok = False
        record.error = (
            f"final model moved by {run.final_shift:.8f} on average, the aggregated clients "
            f"imply {run.expected_shift:.8f} (tolerance {shift_tolerance(case):.2e})"
        )
    return record


def _start_proxy(workdir: Path, listen: int, target: int) -> subprocess.Popen[bytes]:
    """The byte proxy in front of the server (not a measured process: it is the instrument)."""
    argv = [sys.executable, "-m", "benchmarks.byteproxy", "--listen", f"127.0.0.1:{listen}"]
    argv += ["--target", f"127.0.0.1:{target}", "--samples", str(workdir / "bytes.jsonl")]
    with (workdir / "byteproxy.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    wait_for_port(listen, timeout_s=30)
    return proc


def _failed_record(system: str, case: SecAggCase, error: str) -> SecAggRecord:
    return SecAggRecord(
        system=system,
        mode=case.mode,
        n=case.n,
        d=case.d,
        dropout=case.dropout,
        secure=case.secure,
        rounds=case.rounds,
        ok=False,
        error=error,
    )


def _measure(
    system: SecAggSystem, case: SecAggCase, workdir: Path, max_rss_bytes: int | None
) -> SecAggRecord:
    """Deploy and measure one case in ``workdir``; every process is stopped on return."""
    monitor = ProcessMonitor(0.25, max_rss_bytes)
    namer = KindNamer(monitor)
    server_port = free_port()
    deployed = case.mode == "deployment"
    client_port = free_port() if deployed else server_port
    ctx = RunContext(workdir, server_port, client_port, monitor)
    proxy = _start_proxy(workdir, client_port, server_port) if deployed else None
    monitor.start()
    namer.start()
    try:
        run = system.run(case, ctx)
        namer.stop()
        peaks = monitor.stop()
        record = make_record(system.name, case, run, read_byte_samples(workdir / "bytes.jsonl"))
    except (BenchmarkError, OSError, subprocess.SubprocessError) as exc:
        namer.stop()
        peaks = monitor.stop()
        record = _failed_record(system.name, case, str(exc).replace(str(workdir), "<workdir>"))
    finally:
        ctx.stop_all()
        if proxy is not None:
            stop_tree(proxy.pid)
            proxy.wait()
    record.peak_rss_mb = monitor.peak_total_rss / _MB
    server = peaks.get(SERVER_GROUP)
    record.peak_rss_server_mb = server.peak_sum_rss / _MB if server else None
    sites = [p.peak_sum_rss for name, p in peaks.items() if name.startswith("site-")]
    record.peak_rss_site_mb = max(sites) / _MB if sites else None
    record.rss_by_kind_mb = namer.peaks()
    return record


def run_secagg_case(
    system: SecAggSystem,
    case: SecAggCase,
    *,
    use_lock: bool = True,
    max_rss_bytes: int | None = None,
    keep_workdir: bool = False,
) -> SecAggRecord:
    """Run one case under the heavy-work lock; a failure is a record with ``ok=False``.

    The work directory (logs, timing file) is deleted unless the case failed or
    ``keep_workdir`` is set; its path is printed, never stored in the record.
    """
    if case.mode not in system.modes:
        raise ValueError(f"{system.name} does not support mode {case.mode!r}")
    if not case.drop_stage:
        case = replace(case, drop_stage=system.default_drop_stage(case.secure))
    with heavy_lock() if use_lock else nullcontext():
        workdir = Path(tempfile.mkdtemp(prefix=f"secagg-{system.name}-"))
        load_before = os.getloadavg()
        started = time.monotonic()
        record = _measure(system, case, workdir, max_rss_bytes)
        record.wall_s = time.monotonic() - started
        record.load_before, record.load_after = list(load_before), list(os.getloadavg())
    record.settings = {
        "num_shares": case.num_shares,
        "threshold": case.threshold,
        "drop_stage": case.drop_stage,
        "drop_seed": case.drop_seed,
    }
    if record.ok and not keep_workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"kept the work directory of {system.name} {case}: {workdir}")
    return record


# ------------------------------------------------------------------ Flower 1.42

#: The Flower app folder copied to each case's work directory.
FLOWER_SECAGG_APP = Path(__file__).resolve().parent / "flower_secagg_app"
_CONNECTION = "bench"


def _events_of(events: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == kind]


def _stage_summary(exchanges: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per stage: median seconds and payload bytes per message each way over rounds 2..R
    (round 1 when there is only one), and error replies summed over all rounds."""
    seconds: dict[str, list[float]] = {}
    down: dict[str, list[float]] = {}
    up: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    last = max((ex["round"] for ex in exchanges if isinstance(ex.get("round"), int)), default=1)
    for ex in exchanges:
        stage = str(ex["stage"])
        errors[stage] = errors.get(stage, 0) + int(ex["errors"])
        if isinstance(ex.get("round"), int) and (ex["round"] > 1 or last == 1):
            seconds.setdefault(stage, []).append(float(ex["t"]) - float(ex["started"]))
            down.setdefault(stage, []).append(int(ex["down_bytes"]) / max(int(ex["sent"]), 1))
            replied = int(ex["replies"]) - int(ex["errors"])
            up.setdefault(stage, []).append(int(ex["up_bytes"]) / max(replied, 1))
    return {
        "stage_s": {stage: statistics.median(v) for stage, v in seconds.items()},
        "stage_down_bytes_per_message": {s: statistics.median(v) for s, v in down.items()},
        "stage_up_bytes_per_reply": {s: statistics.median(v) for s, v in up.items()},
        "error_replies_by_stage": errors,
    }


def flower_run_from_events(events: Sequence[dict[str, Any]]) -> SecAggRun:
    """Rounds, bytes and the correctness figures from the ServerApp's timing file.

    A round lasts from ``round_start`` to its ``round_end``; a round the SecAgg+ workflow
    halted has no ``round_end`` and lasts until the next round starts (or the run ends), with
    nothing aggregated. Bytes are the round's exchanges divided by the round's sampled nodes.
    """
    ends = _events_of(events, "end")
    if not ends:
        raise BenchmarkError("the Flower ServerApp did not log its end (run incomplete)")
    starts = {int(e["round"]): e for e in _events_of(events, "round_start")}
    finished = {int(e["round"]): e for e in _events_of(events, "round_end")}
    exchanges = _events_of(events, "exchange")
    numbers = sorted(starts)
    if numbers != list(range(1, len(numbers) + 1)):
        raise BenchmarkError(f"round_start events are not rounds 1..R: {numbers}")
    rounds = []
    for i, number in enumerate(numbers):
        start = float(starts[number]["t"])
        if number in finished:
            stop = float(finished[number]["t"])
        else:
            stop = float(starts[numbers[i + 1]]["t"] if i + 1 < len(numbers) else ends[0]["t"])
        nodes = int(starts[number]["nodes"])
        mine = [ex for ex in exchanges if ex.get("round") == number]
        rounds.append(
            RoundMeasure(
                number=number,
                duration_s=stop - start,
                start_wall=start,
                aggregated=int(finished[number]["results"]) if number in finished else 0,
                payload_up_bytes=sum(int(ex["up_bytes"]) for ex in mine) / nodes,
                payload_down_bytes=sum(int(ex["down_bytes"]) for ex in mine) / nodes,
            )
        )
    end = ends[0]
    return SecAggRun(
        rounds=rounds,
        final_shift=float(end["final_shift"]),
        expected_shift=float(end["expected_shift"]),
        max_abs_error=float(end["max_abs_error"]),
        notes=_stage_summary(exchanges),
    )


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def flower_run_config(case: SecAggCase, timing: Path) -> str:
    """The ``--run-config`` string for the app in ``flower_secagg_app/``."""
    return (
        f"num-params={case.d} num-rounds={case.rounds} num-clients={case.n} "
        f"secure={'true' if case.secure else 'false'} num-shares={case.num_shares} "
        f"threshold={case.threshold} dropout={case.dropout!r} "
        f'drop-stage="{case.drop_stage}" drop-seed={case.drop_seed} timing-file="{timing}"'
    )


class FlowerSecAgg(SecAggSystem):
    """Flower 1.42: legacy FedAvg with or without ``SecAggPlusWorkflow``.

    Simulation: ``flower-superlink --simulation`` and the Ray backend with one CPU per
    virtual client (two Ray actors on a 2-core host), as in the design notes. Deployment: a
    SuperLink and ``n`` SuperNodes dialling the byte proxy, one ``FLWR_HOME`` per process,
    telemetry and runtime dependency installation off, ``--insecure``.
    """

    name = "flower"
    modes = MODES

    def default_drop_stage(self, secure: bool) -> str:
        """Dropping after the key exchange makes SecAgg+ reconstruct the masks."""
        return "collect_masked_vectors" if secure else "train"

    def run(self, case: SecAggCase, ctx: RunContext) -> SecAggRun:
        """Start the SuperLink (and SuperNodes), submit the app, wait for its end event."""
        app_dir = ctx.workdir / "app"
        shutil.copytree(FLOWER_SECAGG_APP, app_dir, ignore=shutil.ignore_patterns("__pycache__"))
        timing = ctx.workdir / "timing.jsonl"
        simulation = case.mode == "simulation"
        self._start_superlink(ctx, simulation)
        if not simulation:
            for index in range(case.n):
                self._start_supernode(ctx, index, case.n)
        args = ["run", str(app_dir), _CONNECTION, "--run-config", flower_run_config(case, timing)]
        if simulation:
            args += [
                "--federation-config",
                f"num-supernodes={case.n} client-resources-num-cpus=1 "
                "client-resources-num-gpus=0.0",
            ]
        out = self._cli(ctx, [*args, "--format", "json"])
        try:
            run_id = int(json.loads(out[out.index("{") :])["run-id"])
        except (ValueError, KeyError) as exc:
            raise BenchmarkError(f"could not read the run id from `flwr run`: {out!r}") from exc
        events = self._wait_for_end(ctx, timing, case.timeout_s, run_id)
        (ctx.workdir / "logs" / "run.log").write_text(self._run_log(ctx, run_id))
        run = flower_run_from_events(events)
        if not simulation:  # the simulation runtime moves no Fleet bytes
            run.notes["flower_traffic"] = self._traffic(ctx, run_id)
        return run

    def _env(self, ctx: RunContext, home: str) -> dict[str, str]:
        """Offline settings, an own ``FLWR_HOME``, and this venv first on ``PATH``.

        Flower starts its helpers (``flower-superexec``, ``flwr-simulation``) by name.
        """
        path = ctx.workdir / "homes" / home
        path.mkdir(parents=True, exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        return {
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FLWR_HOME": str(path),
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
        }

    def _start_superlink(self, ctx: RunContext, simulation: bool) -> None:
        argv = [console_script("flower-superlink"), "--insecure", "--host", "127.0.0.1"]
        argv += ["--port", str(ctx.server_port), "--disable-runtime-dependency-installation"]
        if simulation:
            argv.append("--simulation")
        ctx.spawn(SERVER_GROUP, "superlink", argv, self._env(ctx, "superlink"))
        wait_for_port(ctx.server_port, timeout_s=120, ctx=ctx)

    def _start_supernode(self, ctx: RunContext, index: int, total: int) -> None:
        argv = [console_script("flower-supernode"), "--insecure"]
        argv += ["--superlink", f"127.0.0.1:{ctx.client_port}", "--host", "127.0.0.1"]
        argv += ["--port", str(free_port()), "--node-config"]
        argv.append(f"partition-id={index} num-partitions={total}")
        name = f"site-{index}"
        ctx.spawn(name, f"supernode-{index}", argv, self._env(ctx, name))

    def _cli(self, ctx: RunContext, args: list[str], timeout_s: float = 300) -> str:
        """The ``flwr`` CLI against our SuperLink; its stdout, or a clear error."""
        env = {**os.environ, **self._env(ctx, "cli")}
        home = Path(env["FLWR_HOME"])
        (home / "config.toml").write_text(cli_config_toml(_CONNECTION, ctx.server_port))
        done = subprocess.run(
            [console_script("flwr"), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=ctx.workdir,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            raise BenchmarkError(
                f"flwr {args[0]} exited {done.returncode}: {done.stdout}{done.stderr}"
            )
        return done.stdout

    def _run_status(self, ctx: RunContext, run_id: int) -> str:
        out = self._cli(ctx, ["ls", "--run-id", str(run_id), "--format", "json"], 60)
        reply = json.loads(out[out.index("{") :])
        return str(reply["runs"][0].get("status", ""))

    def _wait_for_end(
        self, ctx: RunContext, timing: Path, timeout_s: float, run_id: int
    ) -> list[dict[str, Any]]:
        """Poll the timing file; fail early if the process died or Flower ended the run."""
        deadline = time.monotonic() + timeout_s
        next_status = time.monotonic() + 20
        while time.monotonic() < deadline:
            ctx.check_alive()
            events = _read_events(timing)
            if _events_of(events, "end"):
                return events
            if time.monotonic() > next_status:
                next_status = time.monotonic() + 20
                status = self._run_status(ctx, run_id)
                if status.startswith("finished"):
                    (ctx.workdir / "logs" / "run.log").write_text(self._run_log(ctx, run_id))
                    raise BenchmarkError(
                        f"Flower ended run {run_id} as {status!r}; last events: {events[-3:]}"
                    )
            time.sleep(0.5)
        raise BenchmarkError(
            f"Flower run did not finish within {timeout_s:.0f} s; "
            f"last events: {_read_events(timing)[-3:]}"
        )

    def _run_log(self, ctx: RunContext, run_id: int) -> str:
        """The run's ServerApp/simulation log (``flwr log --show``), best effort."""
        try:
            return self._cli(ctx, ["log", str(run_id), _CONNECTION, "--show"], 60)
        except (BenchmarkError, subprocess.TimeoutExpired) as exc:
            return f"could not fetch the run log: {exc}"

    def _traffic(self, ctx: RunContext, run_id: int) -> dict[str, int]:
        """Flower's own Fleet byte counters for the run (``flwr ls``), best effort."""
        try:
            out = self._cli(ctx, ["ls", "--run-id", str(run_id), "--format", "json"], 60)
            return traffic_from_ls(json.loads(out[out.index("{") :]))
        except (BenchmarkError, ValueError, subprocess.TimeoutExpired):
            return {}


#: Systems selectable with ``--system``; geofl's SecAgg+ joins here.
SYSTEMS: dict[str, Callable[[], SecAggSystem]] = {"flower": FlowerSecAgg}


# ------------------------------------------------------------------ command line


def _parse_counts(text: str) -> list[int]:
    """``"10,50"`` -> ``[10, 50]``; underscores allowed (``1_000_000``)."""
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers: {text!r}")
    return values


def _parse_fractions(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated fractions: {text!r}") from exc
    if not values or any(not 0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(f"expected fractions in [0, 1): {text!r}")
    return values


def build_cases(args: argparse.Namespace) -> list[SecAggCase]:
    """Cases in run order: clients, then params, then dropout, plain before secure."""
    secure = {"both": [False, True], "yes": [True], "no": [False]}[args.secure]
    return [
        SecAggCase(
            n=n,
            d=d,
            rounds=args.rounds,
            secure=s,
            dropout=dropout,
            mode=args.mode,
            num_shares=args.num_shares,
            threshold=args.threshold,
            drop_stage=args.drop_stage,
            drop_seed=args.drop_seed,
            timeout_s=args.timeout,
        )
        for n in args.clients
        for d in args.params
        for dropout in args.dropout
        for s in secure
    ]


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    fields = ("system", "mode", "n", "d", "dropout", "secure", "rounds")
    return (*(record[f] for f in fields), record.get("settings", {}).get("drop_stage"))


def _load_cases(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    cases = json.loads(out.read_text())["cases"]
    if not isinstance(cases, list):
        raise ValueError(f"{out}: 'cases' is not a list")
    return cases


def merge_cases(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``old`` with every case of the same key replaced by the one in ``new``, new ones last."""
    replaced = {_key(c) for c in new}
    return [c for c in old if _key(c) not in replaced] + new


def _write(out: Path, cases: list[dict[str, Any]]) -> None:
    report = {
        "benchmark": "secure-aggregation",
        "created_unix": time.time(),
        "host": {
            "cpus": os.cpu_count(),
            "memory_gb": psutil.virtual_memory().total / 1e9,
            "python": platform.python_version(),
        },
        "cases": cases,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def _summary_line(r: SecAggRecord) -> str:
    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    state = "ok" if r.ok else f"FAILED: {(r.error or '')[:200]}"
    return (
        f"{r.system} {r.mode} n={r.n} d={r.d} dropout={r.dropout} secure={r.secure}: "
        f"steady {fmt(r.steady_round_s, '.3f')} s/round, rounds "
        f"{' '.join(f'{t:.2f}' for t in r.round_s)}, aggregated {r.aggregated_per_round}, "
        f"payload up/down per client {fmt(r.payload_up_bytes, '.0f')}/"
        f"{fmt(r.payload_down_bytes, '.0f')} B, wire {fmt(r.wire_up_bytes, '.0f')}/"
        f"{fmt(r.wire_down_bytes, '.0f')} B, peak RSS {fmt(r.peak_rss_mb, '.0f')} MB; {state}"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description="SecAgg+ vs plain aggregation cost")
    parser.add_argument("--system", default="flower", choices=sorted(SYSTEMS))
    parser.add_argument("--mode", default="simulation", choices=MODES)
    parser.add_argument("--clients", type=_parse_counts, default=[10])
    parser.add_argument("--params", type=_parse_counts, default=[100_000])
    parser.add_argument("--dropout", type=_parse_fractions, default=[0.0])
    parser.add_argument("--secure", default="both", choices=("both", "yes", "no"))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--num-shares", type=int, default=5)
    parser.add_argument("--threshold", type=int, default=3)
    parser.add_argument("--drop-stage", default="", help="default: the system's choice")
    parser.add_argument("--drop-seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per case, seconds")
    parser.add_argument("--max-rss-gb", type=float, default=16.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/secagg.json"))
    parser.add_argument("--replace", action="store_true", help="start a new file (else merge)")
    parser.add_argument("--keep-workdirs", action="store_true")
    parser.add_argument(
        "--no-lock",
        action="store_true",
        help="do not take the heavy-work lock per case (the caller holds it, e.g. flock(1))",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run every case, merging each record into ``--out`` as soon as it is measured."""
    args = parse_args(argv)
    system = SYSTEMS[args.system]()
    cases = build_cases(args)
    done = [] if args.replace else _load_cases(args.out)
    for case in cases:
        print(f"running {args.system} {case}", flush=True)
        record = run_secagg_case(
            system,
            case,
            use_lock=not args.no_lock,
            max_rss_bytes=int(args.max_rss_gb * 1e9),
            keep_workdir=args.keep_workdirs,
        )
        done = merge_cases(done, [asdict(record)])
        _write(args.out, done)
        print(_summary_line(record), flush=True)


if __name__ == "__main__":
    main()
