"""``geofl server --flower-app DIR`` and ``geofl simulate --flower-app DIR``.

``server`` serves the app's ServerApp to ``geofl client --app <components.clientapp>``
processes started anywhere; ``simulate`` also starts the clients on this machine, with
``partition-id``/``num-partitions`` node config as Flower's simulation gives them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from geofl.server.cli.exit_codes import ExitCode
from geofl.server.cli.serve import (
    console,
    round_reporter,
    run_until_signal,
    simulated_client_command,
    wait_for_exit,
)
from geofl.server.config import ConfigError
from geofl.server.coordinator import AddressInUseError, RunResult
from geofl.server.flower.app_dir import (
    ConfigValue,
    FlowerApp,
    fuse_run_config,
    load_app_dir,
    load_server_app,
    parse_run_config,
)
from geofl.server.flower.config import FlowerRunConfig, load_flower_config
from geofl.server.flower.errors import FlowerAppError
from geofl.server.flower.runner import FlowerCoordinator
from geofl.server.rounds.observers import RoundEndCallback
from geofl.storage import StorageUnavailableError

__all__ = ["client_command", "run_flower"]

_WATCH_S = 0.5


@dataclass(frozen=True)
class _Plan:
    app: FlowerApp
    settings: FlowerRunConfig
    run_config: dict[str, ConfigValue]
    clients: int


def _client_count(settings: FlowerRunConfig, app: FlowerApp) -> int:
    count = settings.simulation.clients or app.num_supernodes
    if count is None:
        raise FlowerAppError(
            f"how many clients? set options.num-supernodes of a federation in {app.pyproject} "
            "(e.g. [tool.flwr.federations.local-simulation] options.num-supernodes = 3) or "
            "simulation.clients in run.yaml (--set simulation.clients=3)"
        )
    return count


def client_command(plan: _Plan, port: int, index: int) -> list[str]:
    """Command line of simulated client ``index``."""
    node_config = dict(plan.settings.simulation.node_config)
    return simulated_client_command(plan.app.clientapp, port, index, plan.clients, node_config)


def _client_env(app: FlowerApp) -> dict[str, str]:
    """The environment of client processes: the app's modules importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(app.root), env.get("PYTHONPATH")]))
    return env


async def _watch(
    coordinator: FlowerCoordinator, clients: Sequence[subprocess.Popen[bytes]]
) -> None:
    """Fail the run if every client process died: the ServerApp would wait for them forever."""
    while True:
        await asyncio.sleep(_WATCH_S)
        codes = [process.poll() for process in clients]
        if clients and all(code is not None for code in codes):
            coordinator.abort(
                f"every client process exited before the ServerApp finished (exit codes {codes}); "
                "see their output above"
            )
            return


async def _serve(plan: _Plan, simulate: bool) -> tuple[RunResult, list[int]]:
    server_app = load_server_app(plan.app)
    rounds = plan.run_config.get("num-server-rounds")
    coordinator = FlowerCoordinator(
        plan.app,
        server_app,
        plan.run_config,
        plan.settings,
        observers=[RoundEndCallback(round_reporter(rounds if isinstance(rounds, int) else None))],
    )
    clients: list[subprocess.Popen[bytes]] = []
    watcher: asyncio.Task[None] | None = None
    try:
        port = await coordinator.start()
        console.print(
            f"geofl: Flower app [bold]{plan.app.fab_id}[/] as run {coordinator.run_name} "
            f"(id {coordinator.run_id}) listening on port {port}"
        )
        if simulate:
            env = _client_env(plan.app)
            clients = [
                subprocess.Popen(client_command(plan, port, i), env=env)
                for i in range(plan.clients)
            ]
            watcher = asyncio.create_task(_watch(coordinator, clients))
        result = await coordinator.run()
        if watcher is not None:
            watcher.cancel()
        codes = [await asyncio.to_thread(wait_for_exit, p) for p in clients]
        return result, codes
    finally:
        if watcher is not None:
            watcher.cancel()
        for process in clients:
            if process.poll() is None:
                process.terminate()
                await asyncio.to_thread(wait_for_exit, process)
        await coordinator.stop()


def _run_until_signal(plan: _Plan, simulate: bool) -> tuple[RunResult, list[int]]:
    """Run the event loop; SIGINT and SIGTERM cancel the run cleanly (KeyboardInterrupt)."""

    return run_until_signal(lambda: _serve(plan, simulate))


def _plan(args: argparse.Namespace, simulate: bool) -> _Plan:
    settings = load_flower_config(args.config, args.overrides)
    app = load_app_dir(args.flower_app, getattr(args, "federation", None))
    run_config = fuse_run_config(app, parse_run_config(args.run_config))
    clients = _client_count(settings, app) if simulate else 0
    return _Plan(app, settings, run_config, clients)


def run_flower(args: argparse.Namespace) -> int:
    """Run ``geofl server/simulate --flower-app DIR``; returns the exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    simulate = args.command == "simulate"
    try:
        plan = _plan(args, simulate)
    except (ConfigError, FlowerAppError) as exc:
        return _fail(ExitCode.USAGE, str(exc))
    try:
        result, codes = _run_until_signal(plan, simulate)
    except FlowerAppError as exc:
        return _fail(ExitCode.USER_CODE, str(exc))
    except StorageUnavailableError as exc:
        return _fail(ExitCode.STORAGE_UNAVAILABLE, str(exc))
    except AddressInUseError as exc:
        return _fail(ExitCode.ADDRESS_IN_USE, str(exc))
    except KeyboardInterrupt:
        return _fail(ExitCode.INTERRUPTED, "interrupted; a Flower app's run cannot be resumed")
    return _report(result, codes)


def _report(result: RunResult, codes: Sequence[int]) -> int:
    if result.status != "completed":
        return _fail(ExitCode.RUN_FAILED, f"run {result.run_id} failed: {result.error}")
    bad = [(i, c) for i, c in enumerate(codes) if c != 0]
    if bad:
        listed = ", ".join(f"client {i} exited {c}" for i, c in bad)
        return _fail(ExitCode.RUN_FAILED, f"run {result.run_id} completed but {listed}")
    console.print(
        f"geofl: run {result.run_id} completed; see "
        f"`geofl runs show {result.run_id} --db {result.db_url}`",
        markup=False,
    )
    return int(ExitCode.OK)


def _fail(code: ExitCode, message: str) -> int:
    console.print(f"geofl: error: {message}", markup=False)
    return int(code)
