"""``geofl server --flower-app DIR`` and ``geofl simulate --flower-app DIR``.

``server`` serves the app's ServerApp to ``geofl client --app <components.clientapp>``
processes started anywhere; ``simulate`` also starts the clients on this machine, with
``partition-id``/``num-partitions`` node config as Flower's simulation gives them, in a few
long-lived worker processes (:mod:`geofl.server.simulation.client_processes`).

Both components are checked before anything starts.  The ServerApp starts once
``run.min_nodes`` nodes have joined (``--min-nodes``; in a simulation, every client), so
its first round samples the whole federation as under Flower's simulation.  A run that
fails ends its simulated clients at once, rather than waiting for them to give up.
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
    check_components,
    fuse_run_config,
    load_app_dir,
    load_server_app,
    parse_run_config,
)
from geofl.server.flower.config import FlowerRunConfig, load_flower_config
from geofl.server.flower.errors import FlowerAppError
from geofl.server.flower.federation import nodes_from_flower_settings
from geofl.server.flower.runner import FlowerCoordinator
from geofl.server.rounds.observers import RoundEndCallback
from geofl.server.simulation.client_processes import ClientLaunch, ClientTarget, start_clients
from geofl.server.simulation.processes import ProcessGroup

__all__ = ["client_launch", "run_flower"]

_WATCH_S = 0.5
_FLOWER_LOGGER = "flwr"


@dataclass(frozen=True)
class _Plan:
    app: FlowerApp
    settings: FlowerRunConfig
    run_config: dict[str, ConfigValue]
    clients: int


def _client_count(settings: FlowerRunConfig, app: FlowerApp, flower: int | None) -> int:
    """run.yaml's count, else Flower's settings outside the app, else the pyproject's."""
    count = settings.simulation.clients or flower or app.num_supernodes
    if count is None:
        raise FlowerAppError(
            "how many clients? pass --federation-config num-supernodes=3 (as to `flwr run`), "
            "set options.num-supernodes of the SuperLink connection in $FLWR_HOME/config.toml "
            f"or of a federation in {app.pyproject} (e.g. "
            "[tool.flwr.federations.local-simulation] options.num-supernodes = 3), or "
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
    """Fail the run if every client process died (the ServerApp would wait for them
    forever), or if one died before every node had joined (it never will)."""
    while True:
        await asyncio.sleep(_WATCH_S)
        codes = clients.poll()
        early = [(i, code) for i, code in enumerate(codes) if code is not None]
        if early and not coordinator.serverapp_started:
            index, code = early[0]
            coordinator.abort(
                f"client {index} exited (code {code}) before every node had joined, so the "
                "ServerApp was not started; see its output above"
            )
            return
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
        if result.status != "completed":  # the clients need not finish: stop() ends them
            return result, []
        return result, await clients.exit_codes()
    finally:
        if watcher is not None:
            watcher.cancel()
        await clients.stop()
        await coordinator.stop()


def _plan(args: argparse.Namespace, simulate: bool) -> _Plan:
    """Everything checked before anything starts: settings, app, components, clients."""
    settings = load_flower_config(args.config, args.overrides)
    federation = getattr(args, "federation", None)
    flower = None
    if simulate:
        flower = nodes_from_flower_settings(args.federation_config, federation)
        if flower.connection_found:  # --federation named a config.toml connection
            federation = None
    app = load_app_dir(args.flower_app, federation)
    check_components(app)
    run_config = fuse_run_config(app, parse_run_config(args.run_config))
    clients = _client_count(settings, app, flower.count if flower else None) if simulate else 0
    min_nodes = args.min_nodes or settings.run.min_nodes or (clients or None)
    run = settings.run.model_copy(update={"min_nodes": min_nodes})
    return _Plan(app, settings.model_copy(update={"run": run}), run_config, clients)


def run_flower(args: argparse.Namespace) -> int:
    """Run ``geofl server/simulate --flower-app DIR``; returns the exit code."""
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # Flower's logger prints with its own handler; passed on to ours, each line showed twice.
    logging.getLogger(_FLOWER_LOGGER).propagate = False
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
