"""``geofl server`` and ``geofl simulate``."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from geofl.protocols.types import Scalar
from geofl.server.cli.exit_codes import ExitCode
from geofl.server.config import ConfigError, ConfigProblem, RunConfig, load_config
from geofl.server.coordinator import AddressInUseError, Coordinator, RunResult
from geofl.server.models.loading import UserCodeError
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundEndCallback, RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation import LinkModel
from geofl.server.simulation.partition import prepare_partitions
from geofl.server.simulation.preflight import check_simulation
from geofl.server.simulation.progress import SimulationProgress
from geofl.server.simulation.shaper import ShaperProcess, link_name, start_shaper_process
from geofl.server.simulation.summary import render_summary, summarize_run
from geofl.server.simulation.traces import TraceSet, load_trace
from geofl.server.simulation.virtual import simulate_virtual, virtual_problems
from geofl.server.simulation.virtual_loop import VirtualTimeLoop
from geofl.storage import StorageUnavailableError, open_database

console = Console(stderr=True, highlight=False, soft_wrap=True)
_CLIENT_EXIT_WAIT_S = 30.0
T = TypeVar("T")


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


class _ProgressHooks(RoundObserver):
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
        self._elapsed()
        self._progress.round_started(number)

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        self._progress.task_settled(task.kind, outcome.status)

    def round_ended(self, record: RoundRecord, status: str) -> None:
        self._progress.round_finished(record, status, self._elapsed())


def _progress(config: RunConfig) -> SimulationProgress:
    simulation = config.simulation
    return SimulationProgress(
        console,
        config.planned_rounds,
        config.strategy.clients_per_round,
        clock_label="simulated" if simulation.clock == "virtual" else "wall",
        metric=simulation.target_metric,
        target=simulation.target_accuracy,
    )


def _print_summary(config: RunConfig, result: RunResult) -> None:
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


def client_command(
    config: RunConfig,
    port: int,
    index: int,
    region: str | None = None,
    extra: Mapping[str, Scalar] | None = None,
) -> list[str]:
    """Command line of simulated client ``index`` (connecting to ``port``, in ``region``).

    ``extra`` node config (e.g. the simulator's partition file) is added to every client's.
    """
    sim = config.simulation
    node_config = {**sim.node_config, **(extra or {})}
    return simulated_client_command(str(sim.app), port, index, sim.clients, node_config, region)


def simulated_client_command(
    app: str,
    port: int,
    index: int,
    clients: int,
    node_config: Mapping[str, object],
    region: str | None = None,
) -> list[str]:
    """``geofl client`` for partition ``index`` of ``clients``, running ``app``."""
    node_config = {**node_config, "partition-id": index, "num-partitions": clients}
    pairs = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in node_config.items()]
    return [
        sys.executable,
        "-m",
        "geofl.client",
        "--server",
        f"127.0.0.1:{port}",
        "--app",
        app,
        "--name",
        f"sim-{index}",
        "--reconnect-for",
        "60",
        *(["--region", region] if region else []),
        "--node-config",
        *pairs,
    ]


def relay_command(
    config: RunConfig, port: int, region: str, listen: int, clients: int
) -> list[str]:
    """Command line of the simulated relay of ``region``: ``clients`` connect on ``listen``."""
    return [
        sys.executable,
        "-m",
        "geofl.server.cli.main",
        "relay",
        "--server",
        f"127.0.0.1:{port}",
        "--region",
        region,
        "--listen",
        f"127.0.0.1:{listen}",
        "--clients-per-round",
        str(max(clients, 1)),
        "--wait-for-clients",
        f"{config.schedule.wait_for_clients_s:g}",
        "--reconnect-for",
        "60",
        "--set",
        f"server.heartbeat_interval_s={config.server.heartbeat_interval_s:g}",
    ]


def client_regions(config: RunConfig) -> list[str | None]:
    """The region of each simulated client, as the WAN model assigns them (None: none)."""
    simulation = config.simulation
    if not simulation.regions:
        return [None] * simulation.clients
    return list(LinkModel.from_config(simulation, config.run.seed).client_regions)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def shapes_links(config: RunConfig) -> bool:
    """Whether a wall-clock simulation routes its clients through the link shaper."""
    simulation = config.simulation
    return bool(simulation.regions) and simulation.shaper and not simulation.relays


def _start_shaper(config: RunConfig, port: int, workdir: Path) -> ShaperProcess:
    """One shaped link per simulated client, as the WAN model draws it, to the server."""
    simulation = config.simulation
    trace = load_trace(simulation.trace) if simulation.trace is not None else None
    traces = trace.for_clients(simulation.clients) if trace is not None else None
    links = LinkModel.from_config(simulation, config.run.seed, traces).links
    return start_shaper_process(links, f"127.0.0.1:{port}", workdir, seed=config.run.seed)


def _start_simulation(
    config: RunConfig,
    port: int,
    shaper: ShaperProcess | None = None,
    extra: Mapping[str, Scalar] | None = None,
) -> list[tuple[str, subprocess.Popen[bytes]]]:
    """Relays (one per region, with ``simulation.relays``) first, then the clients.

    With a ``shaper``, each client connects to its own shaped link instead of the server.
    """
    regions = client_regions(config)
    started: list[tuple[str, subprocess.Popen[bytes]]] = []
    ports: dict[str | None, int] = {}
    if config.simulation.relays:
        for name in config.simulation.regions:
            ports[name] = _free_port()
            command = relay_command(config, port, name, ports[name], regions.count(name))
            started.append((f"relay {name}", subprocess.Popen(command)))
    for index, region in enumerate(regions):
        target = shaper.port_of(link_name(index)) if shaper else ports.get(region, port)
        command = client_command(config, target, index, region, extra)
        started.append((f"client {index}", subprocess.Popen(command)))
    return started


async def _serve(
    config: RunConfig,
    simulate: bool,
    hooks: _ProgressHooks | None = None,
    extra: Mapping[str, Scalar] | None = None,
) -> tuple[RunResult, list[tuple[str, int]]]:
    observer = hooks or RoundEndCallback(round_reporter(config.planned_rounds))
    coordinator = Coordinator(config, observers=[observer])
    processes: list[tuple[str, subprocess.Popen[bytes]]] = []
    shaper: ShaperProcess | None = None
    workdir = tempfile.TemporaryDirectory(prefix="geofl-shaper-")
    try:
        port = await coordinator.start()
        console.print(
            f"geofl: run [bold]{config.run.name}[/] (id {coordinator.run_id}) "
            f"listening on port {port}"
            + (
                f", resuming after round {coordinator.start_round - 1}"
                if coordinator.start_round > 1
                else ""
            )
        )
        if simulate and shapes_links(config):
            shaper = await asyncio.to_thread(_start_shaper, config, port, Path(workdir.name))
            console.print(f"geofl: {config.simulation.clients} client links shaped (user space)")
        if simulate:
            processes = _start_simulation(config, port, shaper, extra)
        result = await coordinator.run()
        codes = [(name, await asyncio.to_thread(wait_for_exit, p)) for name, p in processes]
        return result, codes
    finally:
        for _, process in processes:
            if process.poll() is None:
                process.terminate()
                await asyncio.to_thread(wait_for_exit, process)
        if shaper is not None:
            await asyncio.to_thread(shaper.stop)
        workdir.cleanup()
        await coordinator.stop()


def wait_for_exit(process: subprocess.Popen[bytes]) -> int:
    """The exit code of a child process, killing it if it does not exit in time."""
    try:
        return process.wait(timeout=_CLIENT_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _check_simulation(config: RunConfig, source: str) -> TraceSet | None:
    if not config.simulation.app:
        raise ConfigError(
            [
                ConfigProblem(
                    source,
                    "simulation.app",
                    "required by `geofl simulate` (the client app, module:attr)",
                )
            ]
        )
    if config.simulation.relays:
        _check_relays(config, source)
    elif config.simulation.clients < config.strategy.min_clients:
        raise ConfigError(
            [
                ConfigProblem(
                    source,
                    "simulation.clients",
                    f"{config.simulation.clients} is below strategy.min_clients "
                    f"({config.strategy.min_clients}): no round could ever complete",
                )
            ]
        )
    if config.simulation.clock == "virtual":
        problems = virtual_problems(config, source)
        if problems:
            raise ConfigError(problems)
    return check_simulation(config, source)  # cohort larger than the pool, links, traces


def _partitions(config: RunConfig, source: str, directory: Path) -> dict[str, Scalar]:
    """The simulator's data split, if configured: shown, written, and its node config."""
    regions = None
    if config.simulation.partition is not None and config.simulation.regions:
        regions = [r or "" for r in client_regions(config)]
    plan = prepare_partitions(config, source, directory, regions)
    if plan is None:
        return {}
    console.print(plan.histogram)
    return dict(plan.node_config)


def _run_virtual(
    config: RunConfig, source: str, trace: TraceSet | None, extra: Mapping[str, Scalar]
) -> RunResult:
    """``geofl simulate`` on the virtual clock: simulated clients, no port, simulated time."""
    console.print(
        f"geofl: run [bold]{config.run.name}[/] on the virtual clock: "
        f"{config.simulation.clients} simulated clients, "
        f"{config.strategy.clients_per_round} per round"
    )
    with _progress(config) as progress:
        hooks = _ProgressHooks(progress)
        run = run_until_signal(
            lambda: simulate_virtual(
                config,
                trace,
                extra_node_config=extra,
                observers=[hooks],
            ),
            loop_factory=VirtualTimeLoop,
        )
    _print_summary(config, run.result)
    return run.result


def _check_relays(config: RunConfig, source: str) -> None:
    """With relays the coordinator's nodes are the relays, and each needs clients."""
    regions = config.simulation.regions
    try:
        assigned = client_regions(config)
    except ValueError as exc:
        raise ConfigError([ConfigProblem(source, "simulation.regions", str(exc))]) from exc
    problems = [
        ConfigProblem(
            source,
            "simulation.regions",
            f"region {name!r} gets none of the {config.simulation.clients} simulated clients; "
            "its relay would fail every round (raise its share or simulation.clients)",
        )
        for name in regions
        if name not in assigned
    ]
    if len(regions) < config.strategy.min_clients:
        problems.append(
            ConfigProblem(
                source,
                "strategy.min_clients",
                f"{config.strategy.min_clients} exceeds the {len(regions)} relays: with "
                "simulation.relays the coordinator's clients are the relays, one per region",
            )
        )
    if problems:
        raise ConfigError(problems)


def run_serve(args: argparse.Namespace) -> int:
    """Run ``geofl server`` or ``geofl simulate``; returns the exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "flower_app", None) is not None:
        from geofl.server.flower.cli import run_flower  # imports flwr: only for Flower apps

        return run_flower(args)
    if args.config is None:
        return _fail(
            ExitCode.USAGE,
            "-c/--config RUN.yaml is required (or --flower-app DIR for a Flower app)",
        )
    if args.run_config or getattr(args, "federation", None):
        return _fail(ExitCode.USAGE, "--run-config and --federation need --flower-app DIR")
    simulate = args.command == "simulate"
    try:
        config = load_config(args.config, args.overrides)
        trace = None
        if not simulate:
            result, codes = _run_until_signal(config, simulate)
        else:
            trace = _check_simulation(config, str(args.config))
            with tempfile.TemporaryDirectory(prefix="geofl-partition-") as directory:
                extra = _partitions(config, str(args.config), Path(directory))
                if config.simulation.clock == "virtual":
                    result = _run_virtual(config, str(args.config), trace, extra)
                    codes = []
                else:
                    result, codes = _run_until_signal(config, simulate, extra)
    except ConfigError as exc:
        return _fail(ExitCode.USAGE, str(exc))
    except StorageUnavailableError as exc:
        return _fail(ExitCode.STORAGE_UNAVAILABLE, str(exc))
    except AddressInUseError as exc:
        return _fail(ExitCode.ADDRESS_IN_USE, str(exc))
    except UserCodeError as exc:
        return _fail(ExitCode.USER_CODE, str(exc))
    except KeyboardInterrupt:
        return _fail(
            ExitCode.INTERRUPTED,
            "interrupted; the run stays resumable "
            "(start again with the same configuration and database)",
        )
    return _report(result, codes)


def _run_until_signal(
    config: RunConfig, simulate: bool, extra: Mapping[str, Scalar] | None = None
) -> tuple[RunResult, list[tuple[str, int]]]:
    """Run the event loop; SIGINT and SIGTERM cancel the run cleanly (KeyboardInterrupt).

    Cancelling the main task lets every ``finally`` run: client processes are
    stopped and the gRPC server shuts down on its own loop, instead of being torn
    down by the interpreter later.
    """

    if not simulate:
        return run_until_signal(lambda: _serve(config, simulate))
    with _progress(config) as progress:
        outcome = run_until_signal(
            lambda: _serve(config, simulate, _ProgressHooks(progress), extra)
        )
    _print_summary(config, outcome[0])
    return outcome


def run_until_signal(
    work: Callable[[], Awaitable[T]],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run ``work()`` on a new event loop; SIGINT and SIGTERM cancel it (KeyboardInterrupt).

    ``loop_factory`` makes the loop (e.g. a virtual-time one); default: asyncio's.
    """

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio.run always runs main() as a task
            raise RuntimeError("no current task")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await work()

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def _report(result: RunResult, codes: Sequence[tuple[str, int]]) -> int:
    if result.status != "completed":
        return _fail(ExitCode.RUN_FAILED, f"run {result.run_id} failed: {result.error}")
    bad = [(name, c) for name, c in codes if c != 0]
    if bad:
        listed = ", ".join(f"{name} exited {c}" for name, c in bad)
        return _fail(ExitCode.RUN_FAILED, f"run {result.run_id} completed but {listed}")
    console.print(
        f"geofl: run {result.run_id} completed; see "
        f"`geofl runs show {result.run_id} --db {result.db_url}`",
        markup=False,
    )
    return ExitCode.OK


def _fail(code: ExitCode, message: str) -> int:
    console.print(f"geofl: error: {message}", markup=False)
    return int(code)


__all__ = [
    "client_command",
    "client_regions",
    "relay_command",
    "round_reporter",
    "run_serve",
    "simulated_client_command",
]
