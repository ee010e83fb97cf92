"""Launching ``geofl simulate``: the data split, and on the wall clock its processes.

``geofl simulate`` on the wall clock runs the coordinator a deployment runs, listening on
a loopback port, and around it real processes: optionally the user-space link shaper (one
shaped link per client, as the WAN model draws it), one ``geofl relay`` per region with
``simulation.relays``, and the ``simulation.clients`` clients, in a few worker processes
or one process each (:mod:`~geofl.server.simulation.client_processes`). Relays start
before the clients that connect to them. :func:`wall_clock_simulation` starts them all
once the coordinator listens and stops them, and the shaper, however the run ends.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from geofl.protocols.types import Scalar
from geofl.server.config import RunConfig
from geofl.server.simulation.client_processes import ClientLaunch, ClientTarget, start_clients
from geofl.server.simulation.commands import relay_command
from geofl.server.simulation.links import LinkModel
from geofl.server.simulation.partition import PartitionPlan, prepare_partitions
from geofl.server.simulation.processes import ProcessGroup, free_port
from geofl.server.simulation.shaper import ShaperProcess, link_name, start_shaper_process
from geofl.server.simulation.traces import load_trace

__all__ = [
    "WallClockLaunch",
    "client_regions",
    "prepare_split",
    "shapes_links",
    "start_processes",
    "start_shaper",
    "wall_clock_simulation",
]


def client_regions(config: RunConfig) -> list[str | None]:
    """The region of each simulated client, as the WAN model assigns them (None: none)."""
    simulation = config.simulation
    if not simulation.regions:
        return [None] * simulation.clients
    return list(LinkModel.from_config(simulation, config.run.seed).client_regions)


def shapes_links(config: RunConfig) -> bool:
    """Whether a wall-clock simulation routes its clients through the link shaper."""
    simulation = config.simulation
    return bool(simulation.regions) and simulation.shaper and not simulation.relays


def prepare_split(config: RunConfig, source: str, directory: Path) -> PartitionPlan | None:
    """The simulator's data split, if configured, written into ``directory``.

    ``by_region`` needs each client's region; the regions are drawn as the clients will
    get them (:func:`client_regions`), so a client's share matches its region.
    """
    regions = None
    if config.simulation.partition is not None and config.simulation.regions:
        regions = [r or "" for r in client_regions(config)]
    return prepare_partitions(config, source, directory, regions)


def start_shaper(config: RunConfig, port: int, workdir: Path) -> ShaperProcess:
    """One shaped link per simulated client, as the WAN model draws it, to the server."""
    simulation = config.simulation
    trace = load_trace(simulation.trace) if simulation.trace is not None else None
    traces = trace.for_clients(simulation.clients) if trace is not None else None
    links = LinkModel.from_config(simulation, config.run.seed, traces).links
    return start_shaper_process(links, f"127.0.0.1:{port}", workdir, seed=config.run.seed)


def start_processes(
    config: RunConfig,
    port: int,
    group: ProcessGroup,
    shaper: ShaperProcess | None = None,
    extra: Mapping[str, Scalar] | None = None,
) -> None:
    """Relays (one per region, with ``simulation.relays``) first, then the clients.

    With a ``shaper``, each client connects to its own shaped link instead of the server.
    """
    regions = client_regions(config)
    simulation = config.simulation
    ports: dict[str | None, int] = {}
    if config.simulation.relays:
        for name in config.simulation.regions:
            ports[name] = free_port()
            group.start(
                f"relay {name}",
                relay_command(config, port, name, ports[name], regions.count(name)),
            )
    targets = [
        ClientTarget(
            index, shaper.port_of(link_name(index)) if shaper else ports.get(region, port), region
        )
        for index, region in enumerate(regions)
    ]
    launch = ClientLaunch(
        app=str(simulation.app),
        clients=simulation.clients,
        node_config={**simulation.node_config, **(extra or {})},
        threads=simulation.client_threads,
        workers=simulation.workers,
        pooled=simulation.pooled,
    )
    start_clients(group, launch, targets)


@dataclass(frozen=True)
class WallClockLaunch:
    """What :func:`wall_clock_simulation` started: the processes, and the shaper if any."""

    processes: ProcessGroup
    shaper: ShaperProcess | None


@asynccontextmanager
async def wall_clock_simulation(
    config: RunConfig, port: int, extra: Mapping[str, Scalar] | None = None
) -> AsyncIterator[WallClockLaunch]:
    """Start the simulation's processes around the coordinator listening on ``port``.

    On exit, however the block ends, processes still running are terminated and reaped,
    then the shaper is stopped and its work directory removed.

    Parameters
    ----------
    config
        The run; ``simulation`` says how many clients, which regions, relays or shaping.
    port
        The coordinator's loopback port.
    extra
        Node config added to every client's (e.g. the simulator's partition file).
    """
    group = ProcessGroup()
    shaper: ShaperProcess | None = None
    workdir = tempfile.TemporaryDirectory(prefix="geofl-shaper-")
    try:
        if shapes_links(config):
            shaper = await asyncio.to_thread(start_shaper, config, port, Path(workdir.name))
        start_processes(config, port, group, shaper, extra)
        yield WallClockLaunch(group, shaper)
    finally:
        await group.stop()
        if shaper is not None:
            await asyncio.to_thread(shaper.stop)
        workdir.cleanup()
