"""``geofl server --flower-app DIR`` and ``geofl simulate --flower-app DIR``.

``server`` serves the app's ServerApp to ``geofl client --app <components.clientapp>``
processes started anywhere; ``simulate`` also starts the clients on this machine, with
``partition-id``/``num-partitions`` node config as Flower's simulation gives them, in a few
long-lived worker processes (:mod:`geofl.server.simulation.client_processes`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from dataclasses import dataclass

from geofl.server.cli.exit_codes import ExitCode, exit_code_for
from geofl.server.cli.reporting import console, fail, report_run, round_reporter
from geofl.server.cli.signals import run_until_signal
from geofl.server.coordinator import RunResult
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
from geofl.server.simulation.client_processes import ClientLaunch, ClientTarget, start_clients
from geofl.server.simulation.processes import ProcessGroup

__all__ = ["client_launch", "run_flower"]

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


def client_launch(plan: _Plan) -> ClientLaunch:
    """How ``geofl simulate`` runs the app's clients (pooled workers unless configured)."""
    simulation = plan.settings.simulation
    return ClientLaunch(
        app=plan.app.clientapp,
        clients=plan.clients,
        node_config=dict(simulation.node_config),
        threads=simulation.client_threads,
        workers=simulation.workers,
        pooled=simulation.pooled,
        env=_client_env(plan.app),
    )


def _client_env(app: FlowerApp) -> dict[str, str]:
    """The environment of client processes: the app's modules importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(app.root), env.get("PYTHONPATH")]))
    return env


async def _watch(coordinator: FlowerCoordinator, clients: ProcessGroup) -> None:
    """Fail the run if every client process died: the ServerApp would wait for them forever."""
    while True:
        await asyncio.sleep(_WATCH_S)
        codes = clients.poll()
        if codes and all(code is not None for code in codes):
            coordinator.abort(
                f"every client process exited before the ServerApp finished (exit codes {codes}); "
                "see their output above"
            )
            return


async def _serve(plan: _Plan, simulate: bool) -> tuple[RunResult, list[tuple[str, int]]]:
    server_app = load_server_app(plan.app)
    rounds = plan.run_config.get("num-server-rounds")
    coordinator = FlowerCoordinator(
        plan.app,
        server_app,
        plan.run_config,
        plan.settings,
        observers=[RoundEndCallback(round_reporter(rounds if isinstance(rounds, int) else None))],
    )
    clients = ProcessGroup()
    watcher: asyncio.Task[None] | None = None
    try:
        port = await coordinator.start()
        console.print(
            f"geofl: Flower app [bold]{plan.app.fab_id}[/] as run {coordinator.run_name} "
            f"(id {coordinator.run_id}) listening on port {port}"
        )
        if simulate:
            start_clients(
                clients, client_launch(plan), [ClientTarget(i, port) for i in range(plan.clients)]
            )
            watcher = asyncio.create_task(_watch(coordinator, clients))
        result = await coordinator.run()
        if watcher is not None:
            watcher.cancel()
        return result, await clients.exit_codes()
    finally:
        if watcher is not None:
            watcher.cancel()
        await clients.stop()
        await coordinator.stop()


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
    except FlowerAppError as exc:  # the app directory, --run-config or the client count
        return fail(ExitCode.USAGE, str(exc))
    except BaseException as exc:  # exit_code_for re-raises what has no exit code
        return fail(*_failure(exc))
    try:
        outcome = run_until_signal(lambda: _serve(plan, simulate))
    except BaseException as exc:
        return fail(*_failure(exc))
    return report_run(*outcome)


def _failure(exc: BaseException) -> tuple[ExitCode, str]:
    """The exit code of ``exc`` (see :func:`exit_code_for`) and the message to print.

    Only a :class:`FlowerAppError` raised while reading the app, before it runs, is a usage
    error instead (:func:`run_flower` catches it itself): once the ServerApp runs, it is the
    app's code failing.
    """
    code = exit_code_for(exc)
    if code is ExitCode.INTERRUPTED:
        return code, "interrupted; a Flower app's run cannot be resumed"
    return code, str(exc)
