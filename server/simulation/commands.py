"""Command lines of the processes a wall-clock simulation starts: clients and relays.

Clients run as ``geofl client`` (one per process) or ``python -m geofl.client.pool``
(several per process); see :mod:`geofl.server.simulation.client_processes`.

Each runs the code a deployment runs (the pool worker runs the same client runtime, several
at once), pointed at loopback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence

from geofl.server.config import RunConfig

__all__ = [
    "node_config_pairs",
    "pool_command",
    "relay_command",
    "simulated_client_command",
]

#: How long a simulated client or relay keeps reconnecting before it gives up.
_RECONNECT_FOR_S = "60"


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
        _RECONNECT_FOR_S,
        *(["--region", region] if region else []),
        "--node-config",
        *node_config_pairs(node_config),
    ]


def node_config_pairs(node_config: Mapping[str, object]) -> list[str]:
    """``KEY=VALUE`` arguments of ``--node-config`` (booleans as ``true``/``false``)."""
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in node_config.items()]


def pool_command(
    app: str,
    members: Sequence[tuple[int, int, str | None]],
    clients: int,
    node_config: Mapping[str, object],
) -> list[str]:
    """``python -m geofl.client.pool``: simulated clients ``members`` in one worker process.

    ``members`` are (index, port, region) of each client the worker runs, of ``clients``.
    """
    return [
        sys.executable,
        "-m",
        "geofl.client.pool",
        "--app",
        app,
        "--num-partitions",
        str(clients),
        "--reconnect-for",
        _RECONNECT_FOR_S,
        *(
            arg
            for index, port, region in members
            for arg in ("--client", f"{index},127.0.0.1:{port}" + (f",{region}" if region else ""))
        ),
        "--node-config",
        *node_config_pairs(node_config),
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
        _RECONNECT_FOR_S,
        "--set",
        f"server.heartbeat_interval_s={config.server.heartbeat_interval_s:g}",
        *_regional_rule(config),
    ]


def _regional_rule(config: RunConfig) -> list[str]:
    """``simulation.relay.robust`` (and the minimum it was checked against) for a relay
    process: the same regional rule on the wall clock as on the virtual one."""
    relay = config.simulation.relay
    if relay.robust is None:
        return []
    rule = json.dumps(relay.robust.model_dump(mode="json"), separators=(",", ":"))
    return ["--set", f"relay.min_clients={relay.min_clients}", "--set", f"relay.robust={rule}"]
