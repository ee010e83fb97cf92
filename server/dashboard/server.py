"""The dashboard's HTTP server: uvicorn, on a thread and an event loop of its own.

Never on the coordinator's loop: a page load or a slow browser cannot delay a round, and
the page answers on the virtual clock too (whose loop runs far ahead of real time or sits
in a training job). The socket is bound in :meth:`DashboardServer.start`, on the caller's
thread, so an address in use is an error there and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time

import uvicorn

from geofl.protocols.errors import GeoflError
from geofl.server.config.dashboard import DashboardConfig
from geofl.server.control.admins import AdminSessions
from geofl.server.dashboard.app import Broadcaster, make_app
from geofl.server.dashboard.live import LiveState

__all__ = ["DashboardAddressError", "DashboardServer"]

log = logging.getLogger(__name__)

#: Seconds the server waits for open streams when it stops.
_GRACE_S = 1.0
#: Longest start-up of the server, seconds.
_START_S = 30.0


class DashboardAddressError(GeoflError):
    """``server.dashboard.address`` cannot be bound."""


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


class DashboardServer:
    """Serves the dashboard of ``live`` at ``http://<address>/`` until :meth:`stop`."""

    def __init__(
        self, config: DashboardConfig, live: LiveState, sessions: AdminSessions | None
    ) -> None:
        self._config = config
        self._broadcaster = Broadcaster(live)
        self._app = make_app(self._broadcaster, sessions)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None

    def start(self) -> int:
        """Bind and serve; returns the bound port (``address`` may ask for port 0).

        Raises
        ------
        DashboardAddressError
            If the address cannot be bound (in use, or not an address of this machine).
        """
        if self._server is not None:
            return self.port or 0
        config = self._config
        try:
            sock = _bind(config.host, config.port)
        except OSError as exc:
            raise DashboardAddressError(
                f"server.dashboard.address {config.address}: cannot listen ({exc.strerror or exc})"
            ) from exc
        self.port = int(sock.getsockname()[1])
        self._server = uvicorn.Server(
            uvicorn.Config(
                self._app,
                log_level="warning",
                lifespan="off",
                loop="asyncio",
                http="h11",
                ws="none",
                access_log=False,
                timeout_graceful_shutdown=int(_GRACE_S),
            )
        )
        self._thread = threading.Thread(
            target=self._serve, args=(sock,), name="geofl-dashboard", daemon=True
        )
        self._thread.start()
        self._wait_until_serving(self._server)
        log.info("dashboard on %s", self.url)
        return self.port

    def _wait_until_serving(self, server: uvicorn.Server) -> None:
        """Return once uvicorn accepts connections: its start-up (imports, the protocol's
        set-up) must not fall into the first rounds, whose loop may hold the GIL for
        seconds on the virtual clock, and a link handed out must work at once."""
        deadline = time.monotonic() + _START_S
        while not server.started:
            thread = self._thread
            if thread is None or not thread.is_alive():
                raise DashboardAddressError(
                    f"server.dashboard.address {self._config.address}: the server stopped "
                    "while starting (see the log)"
                )
            if time.monotonic() > deadline:
                raise DashboardAddressError(
                    f"server.dashboard.address {self._config.address}: not serving after "
                    f"{_START_S:.0f} s"
                )
            time.sleep(0.005)

    def _serve(self, sock: socket.socket) -> None:
        assert self._server is not None
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(self._server, sock))
        finally:
            sock.close()
            loop.close()

    async def _main(self, server: uvicorn.Server, sock: socket.socket) -> None:
        publisher = asyncio.create_task(self._broadcaster.run())
        try:
            await server.serve(sockets=[sock])
        finally:
            publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await publisher

    @property
    def serving(self) -> bool:
        """Whether it accepts connections now (from :meth:`start`'s return to :meth:`stop`)."""
        server = self._server
        return server is not None and server.started and not server.should_exit

    @property
    def url(self) -> str:
        """The dashboard's base URL (after :meth:`start`), ``http://host:port``."""
        host = self._config.host
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{self.port}"

    def stop(self) -> None:
        """Send the last changes, end every stream, stop serving and release the port."""
        server, thread, loop = self._server, self._thread, self._loop
        self._server = self._thread = self._loop = None
        if server is None:
            return
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(self._broadcaster.finish)
        server.should_exit = True
        if thread is not None:
            thread.join(timeout=5.0 + _GRACE_S)
