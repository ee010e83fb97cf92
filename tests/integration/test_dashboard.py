"""The live dashboard in a real browser (headless Chromium, Selenium) over a real run.

A coordinator serves real gRPC clients, its control API and its dashboard; an admin asks
for a one-time login link with ``geofl runs dashboard`` (the control API, the real
:class:`AdminSessions`), opens it in Chromium, and the page must show the run, its clients
and its rounds, then move on by itself when the next round commits (server-sent events, no
reload). A browser without the cookie, or with a used or forged link, gets the login page.
A virtual-clock simulation serves the same dashboard, answering while the coordinator's
loop is busy.

Chromium comes from Debian (``chromium``, ``chromium-driver``); without it the browser
tests skip, unless ``GEOFL_REQUIRE_CHROMIUM=1`` (CI) makes that a failure. With
``GEOFL_DASHBOARD_SCREENSHOT=PATH`` the browser test also saves the page there (the
README's screenshot comes from ``benchmarks/dashboard_screenshot.py``, on real data).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from geofl.server.cli.credentials import keys_new
from geofl.server.cli.main import main
from geofl.server.control.client import ControlClient
from geofl.server.coordinator import Coordinator
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord
from geofl.server.simulation.virtual import run_virtual_simulation

from .conftest import ServerHandle, run_config

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("GEOFL_REQUIRE_CHROMIUM") == "1"


def _browser() -> Any:
    """A headless Chromium (skips, or fails under GEOFL_REQUIRE_CHROMIUM=1, without one)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        reason = "needs Debian's chromium and chromium-driver (apt-get install ...)"
        if REQUIRED:
            pytest.fail(reason + "; GEOFL_REQUIRE_CHROMIUM=1")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1700",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(check: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def chromium() -> Iterator[Any]:
    driver = _browser()
    yield driver
    driver.quit()


@pytest.fixture
def served(tmp_path: Path, serve_coordinator: Any) -> Iterator[tuple[ServerHandle, Path]]:
    """A long run of four clients in two regions, with its control API and dashboard."""
    key, _ = keys_new("ops", tmp_path / "keys", None, force=False)
    admins = tmp_path / "admins.yaml"
    admins.write_text((tmp_path / "keys" / "ops.node.yaml").read_text())
    config = run_config(
        tmp_path,
        run={"name": "dashboard-demo", "rounds": 300},
        strategy={"clients_per_round": 4, "min_clients": 3},
        server={
            "address": "127.0.0.1:0",
            "heartbeat_interval_s": 0.5,
            "control": {"address": "127.0.0.1:0", "admins": str(admins)},
            "dashboard": {"address": "127.0.0.1:0"},
        },
    )
    handle = serve_coordinator(lambda: Coordinator(config))
    for i in range(4):
        handle.add_client(i, region="eu" if i % 2 else "us", behaviour="slow", delay_s=0.15)
    yield handle, key
    if not handle.result.done():
        with ControlClient(f"127.0.0.1:{handle.coordinator.control_port}", key) as client:
            client.stop_run(handle.coordinator.run_id)
        handle.wait()


def _page(driver: Any, script: str) -> Any:
    return driver.execute_script(script)


def test_the_page_renders_the_run_and_follows_its_rounds(
    served: tuple[ServerHandle, Path], chromium: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    handle, key = served
    coordinator = handle.coordinator
    address = f"127.0.0.1:{coordinator.control_port}"
    assert main(["runs", "dashboard", "--server", address, "--key", str(key)]) == 0
    out, err = capsys.readouterr()
    link = out.strip()
    assert "one-time link, valid 300 s" in err and coordinator.instruments.dashboard_url
    assert link.startswith(coordinator.instruments.dashboard_url + "/login?token=")

    chromium.get(link)
    wait_for(lambda: _page(chromium, "return window.geoflDashboard?.firstRenderMs"), what="render")
    assert chromium.find_element("id", "run-name").text == "dashboard-demo"
    rows = wait_for(
        lambda: len(chromium.find_elements("css selector", "#clients tbody tr")) == 4,
        what="four clients",
    )
    assert rows
    regions = chromium.find_element("id", "regions").text
    tree = chromium.find_element("id", "relays").text
    assert "coordinator" in tree and "region eu" in tree and "region us" in tree

    def committed() -> int:
        text = chromium.find_element("id", "run-progress").text  # "committed N / 300"
        return int(text.split()[1])

    before = wait_for(committed, what="a committed round")
    snapshots = _page(chromium, "return window.geoflDashboard.snapshots")
    wait_for(lambda: committed() >= before + 2, what="the page to follow two more rounds")
    assert _page(chromium, "return window.geoflDashboard.snapshots") == snapshots  # deltas
    points = chromium.find_element("css selector", "#chart-time polyline").get_attribute("points")
    assert len(points.split()) >= before + 2
    assert "eu" in regions and "us" in regions
    assert "B" in chromium.find_element("id", "regions").text  # bytes shown
    assert _page(chromium, "return window.geoflDashboard.updates.length") > 0
    shot = os.environ.get("GEOFL_DASHBOARD_SCREENSHOT")
    if shot:
        wait_for(lambda: committed() >= 12, timeout=60, what="a dozen rounds")
        time.sleep(0.5)
        chromium.save_screenshot(shot)

    # The cookie is the session: without it, and with a used or bad link, no page.
    chromium.delete_all_cookies()

    def refused(url: str, text: str) -> None:
        chromium.get(url)
        wait_for(lambda: text in chromium.page_source, timeout=10, what=f"{text!r} at {url}")

    base = coordinator.instruments.dashboard_url
    refused(base + "/", "Login needed")
    refused(link, "invalid, used or expired")  # used up
    refused(base + "/login?token=forged", "invalid, used or expired")
    assert chromium.get_cookies() == []


class StateReader(RoundObserver):
    """Reads the dashboard's state over HTTP as each round ends, blocking the run's loop."""

    def __init__(self) -> None:
        self.coordinator: Coordinator | None = None
        self.states: dict[int, dict[str, Any]] = {}

    def round_ended(self, record: RoundRecord, status: str) -> None:
        assert self.coordinator is not None
        url = self.coordinator.instruments.dashboard_url
        assert url is not None
        deadline = time.monotonic() + 10
        while True:  # the dashboard publishes from its own thread, this loop waits here
            with urllib.request.urlopen(url + "/api/state", timeout=10) as response:
                state = json.loads(response.read())
            if any(r["number"] == record.number for r in state["rounds"]):
                break
            assert time.monotonic() < deadline
            time.sleep(0.02)
        self.states[record.number] = state


def test_a_virtual_clock_simulation_serves_the_dashboard(tmp_path: Path) -> None:
    config = run_config(
        tmp_path,
        run={"name": "dashboard-virtual", "rounds": 3, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 8, "min_clients": 2},
        schedule={"deadline_s": 600, "wait_for_clients_s": 5},
        evaluation={"every": 0, "server": "geofl_testapp:server_evaluate"},
        server={"dashboard": {"address": "127.0.0.1:0"}},
        simulation={
            "clients": 8,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
            "regions": {
                "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
                "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
            },
            "compute": {"samples_per_s": 1000.0},
        },
    )
    reader = StateReader()

    outcome = run_virtual_simulation(
        config,
        observers=[reader],
        on_start=lambda coordinator, links: setattr(reader, "coordinator", coordinator),
    )
    assert outcome.result.status == "completed"
    assert sorted(reader.states) == [1, 2, 3]
    last = reader.states[3]
    assert last["run"]["name"] == "dashboard-virtual"
    assert len(last["clients"]) == 8
    assert set(last["regions"]) == {"near", "far"}
    assert all(r["status"] == "committed" for r in last["rounds"])
    tasks = last["client_fields"].index("tasks")
    assert sum(c[tasks] for c in last["clients"].values()) >= 8 * 3
