"""What ``geofl simulate`` checks before it starts anything, on either clock.

:mod:`.preflight` decides what any simulation needs (a cohort the population can fill, a
trace that parses, links the WAN model can draw); here come the command's own demands:
a client app to run, enough simulated clients (or, with relays, clients in every region
and a relay per required node), and nothing the virtual clock cannot simulate. Every
failure is a :class:`~geofl.server.config.ConfigError` naming the setting to change,
raised in a second rather than after processes have started.
"""

from __future__ import annotations

from geofl.server.config import ConfigError, ConfigProblem, RunConfig
from geofl.server.simulation.launcher import client_regions
from geofl.server.simulation.preflight import check_simulation
from geofl.server.simulation.traces import TraceSet
from geofl.server.simulation.virtual import virtual_problems

__all__ = ["check_relays", "check_simulate"]


def check_simulate(config: RunConfig, source: str) -> TraceSet | None:
    """Raise :class:`ConfigError` if ``geofl simulate`` cannot run ``config``.

    The checks run in order and the first that fails is raised: the client app, the
    population (or the relays), the virtual clock's limits, then :func:`check_simulation`.

    Returns
    -------
    TraceSet or None
        The parsed ``simulation.trace``, read once here, if there is one.
    """
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
        check_relays(config, source)
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


def check_relays(config: RunConfig, source: str) -> None:
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
