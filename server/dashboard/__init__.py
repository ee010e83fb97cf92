"""The live dashboard of a run (``server.dashboard``): a web page served by the coordinator.

:class:`Dashboard` is what :class:`~geofl.server.instruments.RunInstruments` holds: the
live state (a round observer, on the coordinator's loop) and its HTTP server (uvicorn on
a thread of its own). Who may look: with the control API served (``server.control``), an
admin, through a one-time login link from ``geofl runs dashboard``; without it, anyone
on this machine, and then only a loopback address is allowed (:func:`check_access`).
See docs/dashboard.md.
"""

from __future__ import annotations

from geofl.server.config import ConfigError
from geofl.server.config.dashboard import DashboardConfig
from geofl.server.config.fields import is_loopback
from geofl.server.control.admins import AdminSessions
from geofl.server.dashboard.history import History
from geofl.server.dashboard.live import LiveState
from geofl.server.dashboard.server import DashboardAddressError, DashboardServer
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.registry import Registry

__all__ = ["Dashboard", "DashboardAddressError", "LiveState", "check_access"]


def check_access(config: DashboardConfig, sessions: AdminSessions | None, source: str) -> None:
    """Refuse a dashboard nobody would have to log in to, on an address beyond loopback.

    Raises
    ------
    ConfigError
        ``server.dashboard.address`` is not loopback and no admin sessions guard it.
    """
    if sessions is not None or is_loopback(config.host):
        return
    raise ConfigError.single(
        source,
        f"server.dashboard.address {config.address} is beyond loopback, but no admin login "
        "guards it: set server.control (with its admins) and serve it, or listen on "
        "127.0.0.1 (a dashboard without login is for this machine only)",
        path="server.dashboard.address",
    )


class Dashboard:
    """The live state of one run and the server that shows it."""

    def __init__(
        self,
        config: DashboardConfig,
        history: History,
        registry: Registry,
        sessions: AdminSessions | None,
        clock: Clock = WALL_CLOCK,
    ) -> None:
        self.live = LiveState(history, registry, clock)
        self.server = DashboardServer(config, self.live, sessions)

    @property
    def url(self) -> str | None:
        """The base URL (``http://host:port``) while it serves, else ``None``."""
        return self.server.url if self.server.serving else None

    def start(self) -> int:
        """Serve; the bound port (see :meth:`DashboardServer.start`)."""
        return self.server.start()

    def close(self, status: str) -> None:
        """The run ended with ``status``: show it, then stop serving."""
        self.live.finish(status)
        self.server.stop()
