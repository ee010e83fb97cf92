"""Regional relays: hierarchical aggregation, one relay per region.

``geofl relay`` is a client of the coordinator and a server to its region's clients (the
unchanged ``geofl client``, pointed at the relay). For each task from the coordinator it
runs ``local_rounds`` regional FedAvg rounds (HierFAVG) over its clients and forwards one
update, weighted by the examples of the clients that contributed.
"""

from geofl.server.relay.config import (
    RelayConfig,
    RelaySection,
    UpstreamConfig,
    flag_override,
    load_relay_config,
)
from geofl.server.relay.node import Relay, RelayClient
from geofl.server.relay.regional import RegionalServer
from geofl.server.relay.rounds import (
    MemoryRecorder,
    RegionalError,
    RegionalEvaluation,
    RegionalResult,
    UpstreamTask,
    VersionPlan,
    local_budget,
)

__all__ = [
    "MemoryRecorder",
    "RegionalError",
    "RegionalEvaluation",
    "RegionalResult",
    "RegionalServer",
    "Relay",
    "RelayClient",
    "RelayConfig",
    "RelaySection",
    "UpstreamConfig",
    "UpstreamTask",
    "VersionPlan",
    "flag_override",
    "load_relay_config",
    "local_budget",
]
