"""Prometheus metrics of a run (``server.metrics``): the families, the round observer that
keeps them current, and the HTTP endpoint Prometheus scrapes. docs/metrics.md lists them.
"""

from geofl.server.metrics.endpoint import MetricsAddressError, MetricsEndpoint
from geofl.server.metrics.families import RunMetrics, UploadBufferCollector
from geofl.server.metrics.observer import MetricsObserver

__all__ = [
    "MetricsAddressError",
    "MetricsEndpoint",
    "MetricsObserver",
    "RunMetrics",
    "UploadBufferCollector",
]
