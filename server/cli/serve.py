"""``geofl server`` and ``geofl simulate``: arguments in, a run chosen and shown, an exit code.

The simulation itself, its checks and its processes, lives in :mod:`geofl.server.simulation`
(:mod:`~geofl.server.simulation.launcher` for the wall clock,
:mod:`~geofl.server.simulation.virtual` for the virtual one); Flower apps are handed to
:mod:`geofl.server.cli.flower`, which imports ``flwr`` only when one is run.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

from geofl.protocols.types import Scalar
from geofl.server.cli.exit_codes import ExitCode, exit_code_for
from geofl.server.cli.reporting import (
    ProgressHooks,
    console,
    fail,
    print_summary,
    report_run,
    round_reporter,
    simulation_progress,
)
from geofl.server.cli.signals import run_until_signal
from geofl.server.config import RunConfig, load_config
from geofl.server.coordinator import Coordinator, RunResult
from geofl.server.rounds.observers import RoundEndCallback
from geofl.server.simulation.checks import check_simulate
from geofl.server.simulation.launcher import prepare_split, wall_clock_simulation
from geofl.server.simulation.traces import TraceSet
from geofl.server.simulation.virtual import simulate_virtual
from geofl.server.simulation.virtual_loop import VirtualTimeLoop

__all__ = ["run_serve"]

_INTERRUPTED = (
    "interrupted; the run stays resumable (start again with the same configuration and database)"
)


def run_serve(args: argparse.Namespace) -> int:
    """Run ``geofl server`` or ``geofl simulate``; returns the exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if getattr(args, "flower_app", None) is not None:
        from geofl.server.cli.flower import run_flower  # imports flwr: only for Flower apps

        return run_flower(args)
    if args.config is None:
        return fail(
            ExitCode.USAGE,
            "-c/--config RUN.yaml is required (or --flower-app DIR for a Flower app)",
        )
    flower_only = (
        args.run_config,
        getattr(args, "federation", None),
        getattr(args, "federation_config", None),
        getattr(args, "min_nodes", None),
    )
    if any(flower_only):
        return fail(
            ExitCode.USAGE,
            "--run-config, --federation, --federation-config and --min-nodes need --flower-app DIR",
        )
    try:
        result, codes = _run(args)
    except BaseException as exc:  # exit_code_for re-raises what has no exit code
        code = exit_code_for(exc)
        return fail(code, _INTERRUPTED if code is ExitCode.INTERRUPTED else str(exc))
    return report_run(result, codes)


def _run(args: argparse.Namespace) -> tuple[RunResult, list[tuple[str, int]]]:
    """Serve the configured run, or simulate it on its clock; the result and child exits."""
    config = load_config(args.config, args.overrides)
    new_run = bool(getattr(args, "new_run", False))
    if args.command != "simulate":
        return _run_until_signal(config, simulate=False, new_run=new_run)
    source = str(args.config)
    trace = check_simulate(config, source)
    with tempfile.TemporaryDirectory(prefix="geofl-partition-") as directory:
        extra = _partitions(config, source, Path(directory))
        if config.simulation.clock == "virtual":
            return _run_virtual(config, trace, extra, new_run), []
        return _run_until_signal(config, True, extra, new_run)


def _partitions(config: RunConfig, source: str, directory: Path) -> dict[str, Scalar]:
    """The simulator's data split, if configured: shown, written, and its node config."""
    plan = prepare_split(config, source, directory)
    if plan is None:
        return {}
    console.print(plan.histogram)
    return dict(plan.node_config)


def _run_until_signal(
    config: RunConfig,
    simulate: bool,
    extra: Mapping[str, Scalar] | None = None,
    new_run: bool = False,
) -> tuple[RunResult, list[tuple[str, int]]]:
    """Run the event loop; SIGINT and SIGTERM cancel the run cleanly (KeyboardInterrupt)."""
    if not simulate:
        return run_until_signal(lambda: _serve(config, simulate, new_run=new_run))
    with simulation_progress(config) as progress:
        outcome = run_until_signal(
            lambda: _serve(config, simulate, ProgressHooks(progress), extra, new_run)
        )
    print_summary(config, outcome[0])
    return outcome


async def _serve(
    config: RunConfig,
    simulate: bool,
    hooks: ProgressHooks | None = None,
    extra: Mapping[str, Scalar] | None = None,
    new_run: bool = False,
) -> tuple[RunResult, list[tuple[str, int]]]:
    """Serve the run; with ``simulate``, around the wall-clock simulation's processes."""
    observer = hooks or RoundEndCallback(round_reporter(config.planned_rounds))
    coordinator = Coordinator(config, observers=[observer], new_run=new_run)
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
            + (
                f"; control API on port {coordinator.control_port}"
                if coordinator.control_port is not None
                else ""
            )
        )
        endpoint = coordinator.instruments.endpoint
        if endpoint is not None:
            console.print(f"geofl: metrics at {endpoint.url}")
        if not simulate:
            return await coordinator.run(), []
        async with wall_clock_simulation(config, port, extra) as launch:
            if launch.shaper is not None:
                console.print(
                    f"geofl: {config.simulation.clients} client links shaped (user space)"
                )
            result = await coordinator.run()
            return result, await launch.processes.exit_codes()
    finally:
        await coordinator.stop()


def _run_virtual(
    config: RunConfig, trace: TraceSet | None, extra: Mapping[str, Scalar], new_run: bool
) -> RunResult:
    """``geofl simulate`` on the virtual clock: simulated clients, no port, simulated time."""
    console.print(
        f"geofl: run [bold]{config.run.name}[/] on the virtual clock: "
        f"{config.simulation.clients} simulated clients, "
        f"{config.strategy.clients_per_round} per round"
    )
    with simulation_progress(config) as progress:
        hooks = ProgressHooks(progress)
        run = run_until_signal(
            lambda: simulate_virtual(
                config,
                trace,
                extra_node_config=extra,
                observers=[hooks],
                new_run=new_run,
            ),
            loop_factory=VirtualTimeLoop,
        )
    print_summary(config, run.result)
    return run.result
