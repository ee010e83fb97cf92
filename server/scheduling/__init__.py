"""WAN-aware scheduling: what the server measures of each client, and plans made from it.

:class:`LinkEstimator` turns the tasks the round engine hands out anyway into per-node
estimates of round-trip time, downlink and uplink throughput, compute speed and
availability (:class:`LinkEstimate`), with no probe traffic beyond a small handshake.
"""

from geofl.server.scheduling.measurements import LinkEstimate, LinkEstimator

__all__ = ["LinkEstimate", "LinkEstimator"]
