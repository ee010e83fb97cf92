"""Checks of a simulation that need more than one section, or a file, to decide.

The configuration models validate each section on its own; whether the cohort fits the
simulated population, or whether the trace file parses, is decided here, once, before a
simulation starts anything. Plain ``geofl server`` runs never call this: there
``simulation.clients`` is unused and may well be below the cohort size.
"""

from __future__ import annotations

from geofl.server.config import ConfigError, ConfigProblem, RunConfig
from geofl.server.simulation.links import LinkModel
from geofl.server.simulation.traces import TraceError, TraceSet, load_trace

__all__ = ["check_simulation", "simulation_problems"]


def _cohort_problems(config: RunConfig, source: str) -> list[ConfigProblem]:
    wanted, population = config.strategy.clients_per_round, config.simulation.clients
    if wanted <= population:
        return []
    return [
        ConfigProblem(
            source,
            "strategy.clients_per_round",
            f"more clients per round than exist: {wanted} per round but simulation.clients "
            f"is {population}; lower clients_per_round or simulate more clients",
        )
    ]


def simulation_problems(
    config: RunConfig, source: str
) -> tuple[list[ConfigProblem], TraceSet | None]:
    """Every problem found, and the trace (read once here) if it parsed.

    Checks that ``strategy.clients_per_round`` does not exceed ``simulation.clients``,
    that ``simulation.trace`` parses, and that the link model can be built from the
    regions and the trace.
    """
    problems = _cohort_problems(config, source)
    trace: TraceSet | None = None
    simulation = config.simulation
    if simulation.trace is not None:
        try:
            trace = load_trace(simulation.trace)
        except TraceError as exc:
            problems.append(ConfigProblem(source, "simulation.trace", str(exc)))
    if simulation.regions or trace is not None:
        traces = trace.for_clients(simulation.clients) if trace is not None else None
        try:
            LinkModel.from_config(simulation, config.run.seed, traces)
        except ValueError as exc:
            problems.append(ConfigProblem(source, "simulation.regions", str(exc)))
    return problems, trace


def check_simulation(config: RunConfig, source: str) -> TraceSet | None:
    """Raise :class:`ConfigError` listing every problem; return the parsed trace, if any.

    Meant for ``geofl simulate`` before it starts the server or any client, so that a
    bad trace or an impossible cohort fails in a second with all its reasons.
    """
    problems, trace = simulation_problems(config, source)
    if problems:
        raise ConfigError(problems)
    return trace
