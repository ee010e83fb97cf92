"""Simulation: the WAN link model, client traces, data partitions, and the two clocks.

The names exported here are pure and transport-free (links, traces, partitions,
preflight). The machinery that runs simulations lives in its own modules: ``virtual_loop``,
``fleet``, ``workers``, ``backends``, ``ray_backend`` and ``virtual`` (the virtual clock),
``launcher``, ``client_processes``, ``commands``, ``processes`` and ``shaper`` (the wall
clock's relay, client-worker and user-space link-emulator processes), ``checks`` (what
``geofl simulate`` refuses before it starts anything), ``progress`` and ``summary``.

Names are imported on first use, so that ``python -m geofl.server.simulation.traces``
runs that module once (``runpy`` warns when the package has imported it already).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from geofl.server.config.simulation import (
    ComputeConfig,
    Distribution,
    Heterogeneity,
    PartitionConfig,
    RegionModel,
)

if TYPE_CHECKING:
    from geofl.server.simulation.links import (
        DEFAULT_REGION,
        ClientLink,
        LinkModel,
        draw_multipliers,
        region_counts,
        sync_round_time_s,
        transfer_time_s,
    )
    from geofl.server.simulation.partition import (
        PartitionError,
        describe_partition,
        label_histogram,
        label_skew,
        partition_data,
        render_label_histogram,
    )
    from geofl.server.simulation.preflight import check_simulation, simulation_problems
    from geofl.server.simulation.traces import (
        Availability,
        ClientTrace,
        DeviceCapacity,
        TraceError,
        TraceSet,
        load_trace,
        parse_trace,
    )

__all__ = [
    "DEFAULT_REGION",
    "Availability",
    "ClientLink",
    "ClientTrace",
    "ComputeConfig",
    "DeviceCapacity",
    "Distribution",
    "Heterogeneity",
    "LinkModel",
    "PartitionConfig",
    "PartitionError",
    "RegionModel",
    "TraceError",
    "TraceSet",
    "check_simulation",
    "describe_partition",
    "draw_multipliers",
    "label_histogram",
    "label_skew",
    "load_trace",
    "parse_trace",
    "partition_data",
    "region_counts",
    "render_label_histogram",
    "simulation_problems",
    "sync_round_time_s",
    "transfer_time_s",
]


_LAZY = {
    "links": (
        "DEFAULT_REGION",
        "ClientLink",
        "LinkModel",
        "draw_multipliers",
        "region_counts",
        "sync_round_time_s",
        "transfer_time_s",
    ),
    "partition": (
        "PartitionError",
        "describe_partition",
        "label_histogram",
        "label_skew",
        "partition_data",
        "render_label_histogram",
    ),
    "preflight": ("check_simulation", "simulation_problems"),
    "traces": (
        "Availability",
        "ClientTrace",
        "DeviceCapacity",
        "TraceError",
        "TraceSet",
        "load_trace",
        "parse_trace",
    ),
}
_MODULE_OF = {name: module for module, names in _LAZY.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
