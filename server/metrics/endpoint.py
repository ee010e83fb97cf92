"""The HTTP endpoint Prometheus scrapes: prometheus_client's WSGI server, on its own thread.

The server runs in a daemon thread of its own, never on the coordinator's event loop, so
a scrape neither waits for a round nor slows one, and it answers on the virtual clock too
(whose loop may run far ahead of real time or sit in a training job).
"""

from __future__ import annotations

import logging
import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from geofl.protocols.errors import GeoflError
from geofl.server.config.metrics import MetricsConfig

__all__ = ["MetricsAddressError", "MetricsEndpoint"]

log = logging.getLogger(__name__)


class MetricsAddressError(GeoflError):
    """``server.metrics.address`` cannot be bound."""


class MetricsEndpoint:
    """Serves ``registry`` at ``http://<address>/metrics`` until :meth:`stop`."""

    def __init__(self, config: MetricsConfig, registry: CollectorRegistry) -> None:
        self._config = config
        self._registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (``address`` may ask for port 0).

        Raises
        ------
        MetricsAddressError
            If the address cannot be bound (in use, or not an address of this machine).
        """
        if self._server is not None:
            return self.port or 0
        config = self._config
        try:
            self._server, self._thread = start_http_server(
                config.port, addr=config.host, registry=self._registry
            )
        except OSError as exc:
            raise MetricsAddressError(
                f"server.metrics.address {config.address}: cannot listen ({exc.strerror or exc})"
            ) from exc
        self.port = int(self._server.server_address[1])
        log.info("metrics on http://%s:%d/metrics", config.host, self.port)
        return self.port

    @property
    def url(self) -> str:
        """Where the metrics are served (after :meth:`start`)."""
        host = self._config.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving and release the port; a scrape in flight finishes first."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5.0)
