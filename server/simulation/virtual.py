"""``geofl simulate`` on the virtual clock: the real coordinator, simulated clients and time.

The coordinator, round engine, strategy, recorder and model store are the ones a
deployment runs; only the clock (a :class:`~geofl.server.nodes.clock.LoopClock` over a
:class:`~geofl.server.simulation.virtual_loop.VirtualTimeLoop`) and the clients
(:class:`~geofl.server.simulation.fleet.VirtualFleet`, whose jobs run in a backend; with
``simulation.relays`` behind :class:`~geofl.server.simulation.relays.VirtualRelays`) are
simulated. No port is opened. The run is recorded with ``simulated_clock`` set, and every
timestamp and duration in it is simulated.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from geofl.protocols.tensors import spec_of
from geofl.protocols.types import Scalar
from geofl.server.config import ConfigError, ConfigProblem, RunConfig
from geofl.server.coordinator import Coordinator, RunResult
from geofl.server.nodes.clock import LoopClock
from geofl.server.rounds.observers import RoundObserver
from geofl.server.simulation.backends import make_backend
from geofl.server.simulation.client_processes import cpu_cores
from geofl.server.simulation.fleet import FleetStats, VirtualFleet, links_for
from geofl.server.simulation.links import ClientLink, LinkModel
from geofl.server.simulation.partition import prepare_partitions
from geofl.server.simulation.relays import VirtualRelays
from geofl.server.simulation.traces import ClientTrace, TraceSet
from geofl.server.simulation.virtual_loop import run_virtual
from geofl.server.simulation.workers import WorkerSetup

__all__ = ["VirtualRun", "run_virtual_simulation", "simulate_virtual", "virtual_problems"]


@dataclass
class VirtualRun:
    """How a virtual-clock simulation ended: the run, and what the fleet moved."""

    result: RunResult
    stats: FleetStats
    simulated_s: float


def virtual_problems(config: RunConfig, source: str) -> list[ConfigProblem]:
    """What the virtual clock cannot simulate in this configuration."""
    problems = []
    if config.secure_aggregation.enabled and config.simulation.relays:
        problems.append(
            ConfigProblem(
                source,
                "secure_aggregation.enabled",
                "secure aggregation with simulation.relays is not simulated on the virtual "
                "clock yet; use simulation.clock: wall",
            )
        )
    return problems


def default_workers(config: RunConfig) -> int:
    """``simulation.workers``, or one per CPU core (at most one per client)."""
    chosen = config.simulation.workers
    if chosen is None:
        chosen = cpu_cores()
    return min(chosen, config.simulation.clients)


def client_links(
    config: RunConfig, traces: TraceSet | None
) -> tuple[list[ClientLink], list[ClientTrace] | None]:
    """Each client's link (instant when there is no WAN model) and trace."""
    simulation = config.simulation
    per_client = traces.for_clients(simulation.clients) if traces is not None else None
    model = None
    if simulation.regions or per_client is not None:
        model = LinkModel.from_config(simulation, config.run.seed, per_client).links
    return links_for(model, simulation.clients, simulation.compute.samples_per_s), per_client


async def simulate_virtual(
    config: RunConfig,
    traces: TraceSet | None = None,
    *,
    observers: Sequence[RoundObserver] = (),
    on_start: Callable[[Coordinator, Sequence[ClientLink]], None] = lambda c, links: None,
    extra_node_config: Mapping[str, Scalar] | None = None,
    new_run: bool = False,
) -> VirtualRun:
    """Run ``config`` with virtual clients on the running (virtual-time) loop.

    ``observers`` hear of every round (after the database recorder);
    ``extra_node_config`` (e.g. the simulator's partition file) is added to every client's;
    ``new_run``: see :class:`~geofl.server.coordinator.Coordinator`.
    """
    clock = LoopClock(asyncio.get_running_loop())
    coordinator = Coordinator(
        config, observers=observers, clock=clock, listen=False, new_run=new_run
    )
    links, per_client = client_links(config, traces)
    simulation = config.simulation
    setup = WorkerSetup(
        app=str(simulation.app),
        run_config=dict(config.round_config),
        node_config={**simulation.node_config, **(extra_node_config or {})},
        num_clients=simulation.clients,
        client_cache=simulation.client_cache,
    )
    backend = make_backend(simulation.backend, setup, default_workers(config))
    try:
        await backend.start()
        fleet: VirtualFleet | VirtualRelays
        if simulation.relays:
            fleet = VirtualRelays(
                config=config,
                registry=coordinator.registry,
                models=coordinator.models,
                backend=backend,
                clock=clock,
                links=links,
                traces=per_client,
                spec=spec_of(coordinator.weights),
                run_id=coordinator.run_id,
            )
        else:
            fleet = VirtualFleet(
                registry=coordinator.registry,
                models=coordinator.models,
                backend=backend,
                clock=clock,
                links=links,
                traces=per_client,
                compression=config.compression,
                spec=spec_of(coordinator.weights),
                run_id=coordinator.run_id,
                seed=config.run.seed,
            )
        fleet.join(coordinator.join_nodes)
        on_start(coordinator, links)
        try:
            result = await coordinator.run()
        finally:
            await fleet.close()
    finally:
        await backend.close()
        await coordinator.stop()
    return VirtualRun(result, fleet.stats, clock.elapsed())


def run_virtual_simulation(
    config: RunConfig,
    traces: TraceSet | None = None,
    *,
    observers: Sequence[RoundObserver] = (),
    on_start: Callable[[Coordinator, Sequence[ClientLink]], None] = lambda c, links: None,
) -> VirtualRun:
    """:func:`simulate_virtual` on a fresh virtual-time event loop.

    With ``simulation.partition`` the simulator's split is made first (as ``geofl simulate``
    does) and its file lives as long as the run.

    Raises
    ------
    ConfigError
        If the configuration asks for something the virtual clock does not simulate, or
        the partition cannot be made.
    """
    problems = virtual_problems(config, "simulation")
    if problems:
        raise ConfigError(problems)
    with tempfile.TemporaryDirectory(prefix="geofl-partition-") as directory:
        regions = None
        if config.simulation.partition is not None and config.simulation.regions:
            regions = [link.region for link in client_links(config, traces)[0]]
        plan = prepare_partitions(config, "simulation", Path(directory), regions)
        return run_virtual(
            simulate_virtual(
                config,
                traces,
                observers=observers,
                on_start=on_start,
                extra_node_config=plan.node_config if plan is not None else None,
            )
        )
