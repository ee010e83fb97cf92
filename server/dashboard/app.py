"""The dashboard's web application: the page, its login, and the stream of its updates.

Routes: ``/`` (the page), ``/static/...`` (its script and style, from the package),
``/login?token=...`` (redeems a one-time link and sets the session cookie), ``/logout``,
``/api/state`` (the whole state, JSON) and ``/api/events`` (server-sent events: a
``snapshot`` first, then a ``delta`` whenever something changed). With admin sessions,
every route but ``/login`` needs the cookie: without it the answer is 401.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from geofl.server.control.admins import AdminSessions
from geofl.server.dashboard.live import LiveState

__all__ = ["COOKIE", "Broadcaster", "make_app"]

#: The session cookie's name.
COOKIE = "geofl_dashboard"
#: Seconds between two looks for changes (what an update can lag behind its event).
TICK_S = 0.1
#: Ticks between two recounts of the online nodes (if the registry changed): 0.5 s.
RECOUNT_TICKS = 5
#: Seconds between two keep-alive comments on an idle stream.
KEEPALIVE_S = 15.0
#: Deltas a browser may lag behind before its stream is closed (it reconnects and
#: starts again from a snapshot).
MAX_BACKLOG = 256

#: Only this server's own script, style and stream; no frames (no clickjacking).
_SECURITY = {
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
_STATIC = resources.files("geofl.server.dashboard") / "static"
_REFUSED = (
    "<!doctype html><title>geofl dashboard: login needed</title>"
    "<h1>Login needed</h1><p>{reason}</p><p>Ask for a one-time link with "
    "<code>geofl runs dashboard --server HOST:PORT --key KEY</code> and open it.</p>"
)


def _event(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


class Broadcaster:
    """Sends the live state's deltas to every open stream (on the dashboard's loop)."""

    def __init__(self, live: LiveState) -> None:
        self.live = live
        self._streams: set[asyncio.Queue[bytes | None]] = set()

    def open(self) -> tuple[asyncio.Queue[bytes | None], bytes]:
        """A new stream's queue and its first event (a snapshot), taken together."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(MAX_BACKLOG)
        self._streams.add(queue)
        return queue, _event("snapshot", self.live.snapshot_json())

    def close(self, queue: asyncio.Queue[bytes | None]) -> None:
        """The stream of ``queue`` ended."""
        self._streams.discard(queue)

    def publish(self) -> None:
        """Send what changed since the last call to every stream (encoded once; with no
        stream open, only forgotten)."""
        if not self._streams:  # nobody watches: no encoding
            self.live.skip_changes()
            return
        delta = self.live.take_delta_json()
        if delta is None:
            return
        message = _event("delta", delta)
        for queue in list(self._streams):
            try:
                queue.put_nowait(message)
            except asyncio.QueueFull:  # too far behind: end it, the browser reconnects
                self._streams.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    def finish(self) -> None:
        """Send the last changes, then end every stream (the dashboard stops)."""
        self.publish()
        for queue in list(self._streams):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(None)
        self._streams.clear()

    async def run(self) -> None:
        """Publish every :data:`TICK_S`, ask for a recount of the online nodes every
        :data:`RECOUNT_TICKS` ticks, until cancelled."""
        ticks = 0
        while True:
            await asyncio.sleep(TICK_S)
            ticks += 1
            if ticks % RECOUNT_TICKS == 0:
                self.live.request_recount()
            self.publish()


async def _stream(broadcaster: Broadcaster) -> AsyncIterator[bytes]:
    queue, first = broadcaster.open()
    try:
        yield first
        while True:
            try:
                message = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if message is None:
                return
            yield message
    finally:
        broadcaster.close(queue)


def make_app(broadcaster: Broadcaster, sessions: AdminSessions | None) -> Starlette:
    """The dashboard of ``broadcaster``'s run; ``sessions=None``: no login (loopback only)."""

    def admin(request: Request) -> str | None:
        if sessions is None:
            return "local"
        token = request.cookies.get(COOKIE)
        return sessions.verify(token) if token else None

    def refused(request: Request, reason: str) -> Response:
        if request.url.path.startswith("/api/"):
            return PlainTextResponse(reason, status_code=401)
        return HTMLResponse(_REFUSED.format(reason=reason), status_code=401)

    async def page(request: Request) -> Response:
        if admin(request) is None:
            return refused(request, "No valid dashboard session.")
        html = (_STATIC / "index.html").read_text(encoding="utf-8")
        return HTMLResponse(html, headers={"Cache-Control": "no-store", **_SECURITY})

    async def login(request: Request) -> Response:
        if sessions is None:
            return RedirectResponse("/", status_code=303)
        name = sessions.redeem(request.query_params.get("token", ""))
        if name is None:
            return refused(request, "This login link is invalid, used or expired.")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            sessions.issue(name),
            max_age=int(sessions.ttl_s),
            httponly=True,
            samesite="strict",
            path="/",
        )
        return response

    async def logout(request: Request) -> Response:
        token = request.cookies.get(COOKIE)
        if sessions is not None and token:
            sessions.revoke(token)
        response = PlainTextResponse("logged out")
        response.delete_cookie(COOKIE, path="/")
        return response

    async def state(request: Request) -> Response:
        if admin(request) is None:
            return refused(request, "no valid dashboard session")
        return Response(broadcaster.live.snapshot_json(), media_type="application/json")

    async def events(request: Request) -> Response:
        if admin(request) is None:
            return refused(request, "no valid dashboard session")
        return StreamingResponse(
            _stream(broadcaster),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    static = StaticFiles(directory=str(_STATIC))

    async def assets(scope: Any, receive: Any, send: Any) -> None:
        request = Request(scope, receive)
        if admin(request) is None:
            await refused(request, "No valid dashboard session.")(scope, receive, send)
            return
        await static(scope, receive, send)

    return Starlette(
        routes=[
            Route("/", page),
            Route("/login", login),
            Route("/logout", logout),
            Route("/api/state", state),
            Route("/api/events", events),
            Mount("/static", app=assets),
        ]
    )
