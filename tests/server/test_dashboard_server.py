"""The dashboard's HTTP server over real sockets: who gets in, and what it serves.

With admin sessions every route but ``/login`` needs the session cookie that a one-time
link sets; a used, unknown or missing token gets 401. Without them (no control API) only
a loopback address is allowed. The page and its script come from the package, with no
address of any other host in them.
"""

from __future__ import annotations

import http.cookiejar
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from geofl.server.config import ConfigError, parse_config
from geofl.server.config.dashboard import DashboardConfig
from geofl.server.control.admins import AdminSessions
from geofl.server.dashboard import Dashboard, DashboardAddressError, check_access
from geofl.server.dashboard.app import COOKIE
from geofl.server.dashboard.history import History
from geofl.server.instruments import RunInstruments
from geofl.server.models.spool import MemoryBudget
from geofl.server.nodes.registry import Registry

ROUTES = ("/", "/api/state", "/api/events", "/static/dashboard.js")


def history() -> History:
    return History(run={"id": 1, "name": "demo", "status": "running"})


@pytest.fixture
def sessions() -> AdminSessions:
    return AdminSessions()


@pytest.fixture
def dashboard(sessions: AdminSessions) -> Iterator[Dashboard]:
    made = Dashboard(DashboardConfig(address="127.0.0.1:0"), history(), Registry(1.0), sessions)
    made.start()
    yield made
    made.close("completed")


def status_of(opener: urllib.request.OpenerDirector, url: str) -> int:
    try:
        with opener.open(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def browser() -> tuple[urllib.request.OpenerDirector, http.cookiejar.CookieJar]:
    jar = http.cookiejar.CookieJar()
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar)), jar


def test_without_a_cookie_every_route_is_refused(dashboard: Dashboard) -> None:
    opener, _ = browser()
    for route in ROUTES:
        assert status_of(opener, dashboard.server.url + route) == 401, route


def test_a_bad_or_missing_token_is_refused_and_sets_no_cookie(dashboard: Dashboard) -> None:
    opener, jar = browser()
    assert status_of(opener, dashboard.server.url + "/login?token=not-a-token") == 401
    assert status_of(opener, dashboard.server.url + "/login") == 401
    assert list(jar) == []
    assert status_of(opener, dashboard.server.url + "/") == 401


def test_a_session_token_is_no_login_link(dashboard: Dashboard, sessions: AdminSessions) -> None:
    opener, _ = browser()
    assert status_of(opener, dashboard.server.url + "/login?token=" + sessions.issue("ops")) == 401


def test_a_login_link_sets_an_http_only_cookie_once(
    dashboard: Dashboard, sessions: AdminSessions
) -> None:
    link = sessions.issue_link("ops")
    opener, jar = browser()
    assert status_of(opener, f"{dashboard.server.url}/login?token={link}") == 200  # redirected to /
    [cookie] = list(jar)
    assert cookie.name == COOKIE and cookie.has_nonstandard_attr("HttpOnly")
    for route in ROUTES[:2] + ROUTES[3:]:  # the stream stays open: read below
        assert status_of(opener, dashboard.server.url + route) == 200, route
    with opener.open(dashboard.server.url + "/api/events", timeout=10) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        assert stream.readline() == b"event: snapshot\n"
    other, _ = browser()  # the link is used up
    assert status_of(other, f"{dashboard.server.url}/login?token={link}") == 401
    assert status_of(opener, dashboard.server.url + "/logout") == 200
    assert status_of(opener, dashboard.server.url + "/") == 401
    assert sessions.verify(cookie.value or "") is None


def test_the_page_loads_nothing_from_elsewhere() -> None:
    static = resources.files("geofl.server.dashboard") / "static"
    names = sorted(entry.name for entry in static.iterdir())
    assert names == ["dashboard.css", "dashboard.js", "index.html"]
    for name in names:
        text = (static / name).read_text(encoding="utf-8")
        assert "//" not in text.replace("// ", "").replace("//-", ""), name  # no URL


def test_without_admin_sessions_only_loopback_is_allowed() -> None:
    check_access(DashboardConfig(address="127.0.0.1:0"), None, "t")
    check_access(DashboardConfig(address="0.0.0.0:0"), AdminSessions(), "t")
    with pytest.raises(ConfigError, match=r"beyond loopback.*server.control"):
        check_access(DashboardConfig(address="0.0.0.0:0"), None, "t")


def test_without_admin_sessions_the_page_needs_no_login() -> None:
    made = Dashboard(DashboardConfig(address="127.0.0.1:0"), history(), Registry(1.0), None)
    made.start()
    try:
        opener, _ = browser()
        assert status_of(opener, made.server.url + "/") == 200
    finally:
        made.close("completed")


def test_an_address_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        made = Dashboard(
            DashboardConfig(address=f"127.0.0.1:{port}"), history(), Registry(1.0), None
        )
        with pytest.raises(DashboardAddressError, match=f"127.0.0.1:{port}: cannot listen"):
            made.start()


def test_the_instruments_serve_the_dashboard_once_configured(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "run": {"name": "inst"},
        "model": "a.b:c",
        "server": {"dashboard": {"address": "127.0.0.1:0"}},
    }
    made = RunInstruments(
        parse_config(data, source="inst", base_dir=tmp_path), Registry(1.0), 7, MemoryBudget(10)
    )
    assert made.dashboard is not None and made.dashboard.live in made.observers
    assert made.dashboard_url is None  # not before it serves
    made.start()
    assert made.dashboard_url is not None
    opener, _ = browser()
    assert status_of(opener, made.dashboard_url + "/api/state") == 200
    url = made.dashboard_url
    made.close("completed")
    assert made.dashboard_url is None
    with pytest.raises(urllib.error.URLError):  # stopped: the port is closed
        status_of(opener, url + "/api/state")
