"""geofl on loopback: ``geofl server`` + N ``geofl client`` processes, or ``geofl simulate``.

Per run, in the harness's fresh work directory:

1. :func:`run_yaml` writes ``run.yaml``: ``workload.rounds`` rounds, FedAvg over all
   ``workload.clients`` clients (every one must report), no evaluation, the task's model
   (:data:`GEOFL_APPS`), the server on ``127.0.0.1:{server_port}``, SQLite and checkpoints
   in the work directory.
2. Deployment: ``geofl server -c run.yaml`` (group ``server``) and, once it listens, one
   ``geofl client --app <task's app>`` per site (group ``site-<i>``), dialing the
   harness's byte proxy. Simulation (:class:`GeoflSimulationSystem`): ``geofl simulate -c
   run.yaml``, which starts the coordinator and the client processes itself and connects
   them directly. Every process gets the repository root on ``PYTHONPATH`` (they run in
   the work directory) and ``GEOFL_BENCH_PARAMS``.
3. Every process must exit 0 by itself (geofl tells clients the run is over).
4. Rounds come from ``geofl runs show RUN_ID --json`` (the database's select-to-commit
   ``duration_s``, which includes broadcast, training, upload, aggregation and the
   checkpoint, and geofl's own per-round byte counts); the result from the last
   checkpoint: the ``echo`` model's shift against the initial one, or the ``mlp-digits``
   model's test accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from benchmarks.apps.geofl_echo import PARAMS_ENV, make_model
from benchmarks.core import (
    REPO_ROOT,
    SERVER_GROUP,
    BenchmarkError,
    MemoryRole,
    RoundRecord,
    RunContext,
    System,
    SystemRun,
    Workload,
    console_script,
    wait_for_port,
)
from geofl.protocols.types import Weights
from geofl.server.config.errors import ConfigError
from geofl.server.config.overrides import apply_overrides, parse_override
from geofl.storage import CheckpointRecord, CheckpointStore, open_database, queries

__all__ = [
    "GEOFL_APP",
    "GEOFL_APPS",
    "GEOFL_MODEL",
    "GEOFL_REPO_ROOT",
    "RUN_NAME",
    "GeoflSimulationSystem",
    "GeoflSystem",
    "checkpoint_dir",
    "final_shift",
    "phase_medians",
    "rounds_from_runs_show",
    "run_yaml",
]

#: Put on PYTHONPATH of geofl processes so ``benchmarks.apps.geofl_echo`` imports.
GEOFL_REPO_ROOT = REPO_ROOT

#: The client app and server model factory for this workload (``module:attr``).
GEOFL_APP = "benchmarks.apps.geofl_echo:client_app"
GEOFL_MODEL = "benchmarks.apps.geofl_echo:make_model"
#: Task -> (client app, server model factory).
GEOFL_APPS: dict[str, tuple[str, str]] = {
    "echo": (GEOFL_APP, GEOFL_MODEL),
    "mlp-digits": (
        "benchmarks.apps.geofl_digits:client_app",
        "benchmarks.apps.geofl_digits:make_model",
    ),
    "cnn-fashion": (
        "benchmarks.apps.geofl_fashion_cnn:client_app",
        "benchmarks.apps.geofl_fashion_cnn:make_model",
    ),
}
#: ``run.name`` of every benchmark run (each run has its own database).
RUN_NAME = "framework-bench"


def checkpoint_dir(db_path: Path) -> Path:
    """Where a run's checkpoints go: next to its database."""
    return db_path.parent / "checkpoints"


def run_yaml(workload: Workload, server_port: int, db_path: Path) -> dict[str, Any]:
    """The run configuration for ``workload`` as a YAML-ready mapping.

    ``min_clients`` equals the cohort, so a round commits only with every update (as in
    Flower's run); only the newest checkpoint file is kept, so a 100M-parameter run does not
    fill the disk; the client wait is generous because clients start after the server.
    """
    return {
        "run": {"name": RUN_NAME, "rounds": workload.rounds, "seed": 0},
        "model": GEOFL_APPS[workload.task][1],
        "strategy": {
            "name": "fedavg",
            "clients_per_round": workload.clients,
            "min_clients": workload.clients,
        },
        "schedule": {
            "deadline_s": float(workload.timeout_s),
            "wait_for_clients_s": float(workload.timeout_s),
        },
        "evaluation": {"every": 0},
        "storage": {
            "url": f"sqlite:///{db_path}",
            "checkpoints": str(checkpoint_dir(db_path)),
            "keep_checkpoints": 1,
        },
        "server": {"address": f"127.0.0.1:{server_port}"},
    }


def rounds_from_runs_show(reply: Mapping[str, object]) -> list[RoundRecord]:
    """Round records from ``geofl runs show RUN_ID --json``.

    Expects ``{"rounds": [{"number", "duration_s", "bytes_up", "bytes_down", ...}]}``;
    ``started_at`` (ISO 8601, naive meaning UTC, or Unix seconds), when present, lets the
    harness attribute proxy bytes to each round.
    """
    rounds = reply.get("rounds")
    if not isinstance(rounds, list):
        raise BenchmarkError(f"`geofl runs show` JSON has no 'rounds' list: {dict(reply)!r}")
    out = []
    for item in rounds:
        if not isinstance(item, dict):
            raise BenchmarkError(f"`geofl runs show` round is not an object: {item!r}")
        try:
            out.append(
                RoundRecord(
                    number=int(item["number"]),
                    duration_s=float(item["duration_s"]),
                    start_wall=_wall(item.get("started_at")),
                    bytes_up=_opt_int(item.get("bytes_up")),
                    bytes_down=_opt_int(item.get("bytes_down")),
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchmarkError(f"`geofl runs show` round {item!r} is malformed: {exc}") from exc
    return sorted(out, key=lambda r: r.number)


def phase_medians(reply: Mapping[str, object]) -> dict[str, float]:
    """Median seconds per round phase (select, broadcast, fit, ...) over the committed rounds.

    Tells what dominates a round; phases missing from a round count as absent, not zero.
    """
    per_phase: dict[str, list[float]] = {}
    rounds = reply.get("rounds")
    for item in rounds if isinstance(rounds, list) else []:
        phases = item.get("phase_durations") if isinstance(item, dict) else None
        for name, seconds in (phases if isinstance(phases, dict) else {}).items():
            if isinstance(seconds, int | float):
                per_phase.setdefault(str(name), []).append(float(seconds))
    return {name: float(np.median(values)) for name, values in sorted(per_phase.items())}


def _opt_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def _wall(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    parsed = datetime.fromisoformat(str(value))
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def final_shift(initial: Mapping[str, np.ndarray], final: Mapping[str, np.ndarray]) -> float:
    """Mean of ``final - initial`` over every element (float64 accumulation).

    Raises when the tensors' names or shapes differ: a checkpoint of another model is a
    failed run, not a number.
    """
    if list(initial) != list(final):
        raise BenchmarkError(f"checkpoint tensors {list(final)} differ from {list(initial)}")
    total, count = 0.0, 0
    for name, start in initial.items():
        end = final[name]
        if end.shape != start.shape:
            raise BenchmarkError(f"tensor {name!r}: checkpoint {end.shape} vs start {start.shape}")
        total += float(np.subtract(end, start, dtype=np.float64).sum())
        count += start.size
    return total / count if count else 0.0


def add_geofl_set_option(parser: argparse.ArgumentParser) -> None:
    """``--geofl-set KEY.PATH=VALUE`` (repeatable): overrides of geofl's run file."""
    parser.add_argument(
        "--geofl-set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a value of geofl's run file, as `geofl --set` does, e.g. "
        "storage.stage_uploads=false (repeatable)",
    )


def check_geofl_set(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse a malformed ``--geofl-set`` before any run starts (``parser.error`` exits)."""
    try:
        for text in args.geofl_set:
            parse_override(text)
    except (ValueError, ConfigError) as exc:
        parser.error(str(exc))


class GeoflSystem(System):
    """geofl server + N ``geofl client`` processes, measured by the harness.

    ``overrides`` (``KEY.PATH=VALUE`` texts, as ``geofl --set`` takes them, e.g.
    ``storage.stage_uploads=false``) are applied to the run file the benchmark writes.
    """

    name = "geofl"

    def __init__(self, overrides: Sequence[str] = ()) -> None:
        self.overrides = [parse_override(text) for text in overrides]

    def document(self, workload: Workload, ctx: RunContext, db_path: Path) -> dict[str, Any]:
        """:func:`run_yaml` with :attr:`overrides` applied."""
        return apply_overrides(run_yaml(workload, ctx.server_port, db_path), self.overrides)

    def write_config(self, workload: Workload, ctx: RunContext, db_path: Path) -> Path:
        """Write ``ctx.workdir/run.yaml`` for ``workload``; return its path.

        JSON is valid YAML, and writing it avoids quoting pitfalls in paths.
        """
        path = ctx.workdir / "run.yaml"
        path.write_text(json.dumps(self.document(workload, ctx, db_path), indent=2) + "\n")
        return path

    def run(self, workload: Workload, ctx: RunContext) -> SystemRun:
        """Deploy geofl, wait for every process to exit 0, read rounds from the database."""
        db_path = ctx.workdir / "geofl.db"
        config = self.write_config(workload, ctx, db_path)
        env = {PARAMS_ENV: str(workload.params), "PYTHONPATH": str(GEOFL_REPO_ROOT)}
        geofl = console_script("geofl")
        self.launch(workload, ctx, config, env)
        self._wait_for_exit(ctx, workload.timeout_s)
        url = f"sqlite:///{db_path}"
        run_id = _run_id(ctx, geofl, url)
        reply = _cli_json(ctx, [geofl, "runs", "show", str(run_id), "--db", url, "--json"])
        if not isinstance(reply, dict):
            raise BenchmarkError(f"`geofl runs show` did not print a JSON object: {reply!r}")
        run = SystemRun(rounds=rounds_from_runs_show(reply))
        if len(run.rounds) != workload.rounds:
            raise BenchmarkError(f"{len(run.rounds)} rounds recorded, {workload.rounds} planned")
        final = self._final_model(db_path, run_id)
        if workload.task == "echo":
            run.final_shift = _shift_against_initial(workload.params, final)
        else:
            run.accuracy = _task_accuracy(workload.task, final)
        run.system_bytes = _system_bytes(reply)
        run.notes["run_id"] = str(run_id)
        run.notes["phase_median_s"] = json.dumps(phase_medians(reply))
        return run

    def launch(
        self, workload: Workload, ctx: RunContext, config: Path, env: Mapping[str, str]
    ) -> None:
        """Start the server, then one client per site once the server listens."""
        geofl = console_script("geofl")
        ctx.spawn(SERVER_GROUP, "geofl-server", [geofl, "server", "-c", str(config)], env)
        wait_for_port(ctx.server_port, timeout_s=300, ctx=ctx)
        app = GEOFL_APPS[workload.task][0]
        for i in range(workload.clients):
            argv = [geofl, "client", "--server", f"127.0.0.1:{ctx.client_port}", "--app", app]
            argv += ["--node-config", f"partition-id={i}", f"num-partitions={workload.clients}"]
            ctx.spawn(f"site-{i}", f"geofl-client-{i}", argv, env)

    def _wait_for_exit(self, ctx: RunContext, timeout_s: float) -> None:
        """Block until every spawned process exited; any non-zero code is a failure."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ctx.check_alive()
            if all(proc.poll() is not None for proc in ctx.procs):
                return
            time.sleep(0.5)
        running = [str(p.args) for p in ctx.procs if p.poll() is None]
        raise BenchmarkError(
            f"geofl run did not finish within {timeout_s:.0f} s; still running: {running[:3]}; "
            f"logs in {ctx.workdir / 'logs'}"
        )

    def _final_model(self, db_path: Path, run_id: int) -> Weights:
        """The model of the run's last checkpoint."""
        url = f"sqlite:///{db_path}"
        database = open_database(url, migrate=False)
        with database.session() as session:
            row = queries.latest_checkpoint(session, run_id)
            if row is None:
                raise BenchmarkError(f"run {run_id} has no checkpoint in {url}")
            record = CheckpointRecord.from_row(row)
        final, _state = CheckpointStore(checkpoint_dir(db_path)).load(record)
        return dict(final)


class GeoflSimulationSystem(GeoflSystem):
    """``geofl simulate``: the coordinator starts the clients as its own child processes.

    They connect to it directly (no proxy), so bytes are geofl's own per-round counts of
    encoded model and update bytes. Memory roles: ``server`` = the ``geofl simulate``
    process, ``client`` = the largest client process (a worker holding several clients,
    unless ``pooled: false``).
    """

    wire_proxy = False
    memory_roles: ClassVar[Mapping[str, MemoryRole]] = {
        "server": MemoryRole(frozenset({"geofl-simulate"})),
        "client": MemoryRole(frozenset({"geofl-client"}), per_process=True),
    }

    def __init__(
        self, simulation: Mapping[str, object] | None = None, overrides: Sequence[str] = ()
    ) -> None:
        super().__init__(overrides)
        #: Extra ``simulation`` settings (e.g. ``pooled: false``), from ``--geofl-sim``.
        self.simulation = dict(simulation or {})

    def write_config(self, workload: Workload, ctx: RunContext, db_path: Path) -> Path:
        """``run.yaml`` plus the ``simulation`` section: the clients, their app, any extras."""
        path = ctx.workdir / "run.yaml"
        document = self.document(workload, ctx, db_path)
        document["simulation"] = {
            "clients": workload.clients,
            "app": GEOFL_APPS[workload.task][0],
            **self.simulation,
        }
        path.write_text(json.dumps(document, indent=2) + "\n")
        return path

    def launch(
        self, workload: Workload, ctx: RunContext, config: Path, env: Mapping[str, str]
    ) -> None:
        """Start ``geofl simulate``; it starts and stops the clients."""
        argv = [console_script("geofl"), "simulate", "-c", str(config)]
        ctx.spawn(SERVER_GROUP, "geofl-simulate", argv, env)


def _task_accuracy(task: str, final: Mapping[str, np.ndarray]) -> float:
    """Test accuracy of a training task's model; torch is imported only for these tasks."""
    if task == "cnn-fashion":
        from benchmarks.apps import fashion_cnn

        return fashion_cnn.accuracy(final)
    from benchmarks.apps import digits_mlp

    return digits_mlp.accuracy(final)


def _shift_against_initial(params: int, final: Mapping[str, np.ndarray]) -> float:
    """:func:`final_shift` against ``make_model()`` for ``params`` parameters."""
    previous = os.environ.get(PARAMS_ENV)
    os.environ[PARAMS_ENV] = str(params)
    try:
        initial = make_model()
    finally:
        if previous is None:
            del os.environ[PARAMS_ENV]
        else:
            os.environ[PARAMS_ENV] = previous
    return final_shift(initial, final)


def _system_bytes(reply: Mapping[str, object]) -> dict[str, int]:
    """geofl's own per-run traffic accounting (encoded update and model bytes)."""
    run = reply.get("run")
    if not isinstance(run, dict):
        return {}
    return {k: int(run[k]) for k in ("bytes_up", "bytes_down") if isinstance(run.get(k), int)}


def _cli_json(ctx: RunContext, argv: list[str]) -> object:
    """Run a ``geofl`` inspection command and parse its JSON output."""
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=ctx.workdir, timeout=120, check=False
    )
    if done.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise BenchmarkError(f"{' '.join(argv)} printed no JSON: {done.stdout[:200]!r}") from exc


def _run_id(ctx: RunContext, geofl: str, url: str) -> int:
    """The id of the benchmark run in its (fresh) database."""
    runs = _cli_json(ctx, [geofl, "runs", "list", "--db", url, "--json"])
    ids = [
        int(r["id"])
        for r in (runs if isinstance(runs, list) else [])
        if isinstance(r, dict) and r.get("name") == RUN_NAME
    ]
    if len(ids) != 1:
        raise BenchmarkError(f"expected one run named {RUN_NAME!r} in {url}, found {runs!r}")
    return ids[0]
