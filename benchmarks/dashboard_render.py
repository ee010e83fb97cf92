"""How fast the dashboard's page renders a big run, and follows a round, in headless Chromium.

Issue 16's targets: the first render of a run with 500 rounds and 1,000 clients under
1 s, an update under 200 ms. The run is the one of :mod:`benchmarks.report_scale`
(``--rounds`` x ``--clients`` fit participations, three regions, written through the
storage API), read by the dashboard's own :func:`~geofl.server.dashboard.history.load_history`;
all ``--clients`` nodes are online in a registry. The dashboard serves on loopback.

Figures, each the median of ``--repeats``:

- ``first_render_ms``: ``performance.now()`` in the page when the snapshot is rendered
  (from the navigation's start: page, script, the event stream's snapshot, its parsing
  and every table row and chart), and ``first_frame_ms`` at the next animation frame
  (layout and paint included).
- one update = a whole round as the coordinator reports it: ``round_started``, every
  client's ``task_settled``, ``round_ended`` (1,000 outcomes) and ``measurements`` of every
  client: the worst delta, one that changes all 1,000 client rows, a round, the regions.
  ``update_apply_ms`` is the page's work on it (``performance.now()`` around it),
  ``update_frame_ms`` until the next animation frame, and ``update_latency_ms`` from the
  round's end in this process to the page done (the publisher's tick, JSON, the stream,
  the page; ``Date.now()`` against ``time.time()``, one machine).

Run: ``python -m benchmarks.dashboard_render --out DIR`` (prints JSON; needs
``chromium`` and ``chromium-driver``). Not a test: timing stays out of tests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from benchmarks.report_scale import REGIONS, build_run
from geofl.server.config.dashboard import DashboardConfig
from geofl.server.dashboard import Dashboard
from geofl.server.dashboard.history import FIELD, load_history
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.records import Phase, RoundRecord
from geofl.server.scheduling.measurements import LinkEstimate
from geofl.storage import open_database, queries

__all__ = ["main"]


def browser() -> Any:
    """Headless Chromium, as the tests start it."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        raise SystemExit("needs chromium and chromium-driver (Debian packages)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,1700"):  # fmt: skip
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


def wait_for(driver: Any, script: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(script)
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(script)
        time.sleep(0.01)


def play_round(dashboard: Dashboard, number: int, nodes: list[int]) -> float:
    """Report one round of every node to the live state; ``time.time()`` at its end."""
    live = dashboard.live
    loop = asyncio.new_event_loop()
    live.round_started(number, len(nodes))
    live.phase(number, Phase.FIT, 1.0)
    outcomes = []
    for index, node in enumerate(nodes):
        task = TaskRecord(index, node, "fit", number, number - 1, {}, 0.0, loop.create_future())
        task.bytes_down = 1_600_000
        outcome = Outcome("ok", num_examples=100, bytes_up=400_000, loss=0.5)
        live.task_settled(number, task, outcome)
        outcomes.append((task, outcome))
    loop.close()
    record = RoundRecord(
        number,
        phase_durations={"fit": 40.0, "aggregate": 5.0},
        outcomes=outcomes,
        train_loss=1.0 / number,
        server_eval_metrics={"accuracy": 0.9 - 0.4 / number},
    )
    live.round_ended(record, "committed")
    ended = time.time()
    live.measurements(
        number, [LinkEstimate(node, rtt_s=0.05, down_bps=2e7, up_bps=5e6) for node in nodes]
    )
    return ended


def measure(dashboard: Dashboard, nodes: list[int], repeats: int, rounds: int) -> dict[str, Any]:
    """First renders and updates in a fresh browser each repeat."""
    renders, frames, applies, update_frames, latencies = [], [], [], [], []
    number = rounds
    for _ in range(repeats):
        driver = browser()
        try:
            driver.get(dashboard.server.url + "/")
            renders.append(wait_for(driver, "return window.geoflDashboard?.firstRenderMs"))
            frames.append(wait_for(driver, "return window.geoflDashboard.firstFrameMs"))
            rows = driver.execute_script("return document.querySelectorAll('#clients tr').length")
            assert rows == len(nodes) + 1, rows  # the header row, then every client
            for _ in range(3):
                number += 1
                seen = driver.execute_script("return window.geoflDashboard.updates.length")
                ended = play_round(dashboard, number, nodes)
                script = (
                    "const u = window.geoflDashboard.updates;"
                    f"return u.length > {seen} && u.every(e => e.frameMs !== null)"
                    f" && u.some(e => e.seq && e.doneAt >= {ended * 1000})"
                    " ? u.slice(" + str(seen) + ") : null"
                )
                updates = wait_for(driver, script)
                # The round's delta: the one applied after the round ended.
                done = [u for u in updates if u["doneAt"] >= ended * 1000]
                first = done[0]
                applies.append(max(u["applyMs"] for u in updates))
                update_frames.append(max(u["frameMs"] for u in updates))
                latencies.append(first["doneAt"] - ended * 1000)
                time.sleep(0.3)
        finally:
            driver.quit()

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 1)

    return {
        "first_render_ms": median(renders),
        "first_frame_ms": median(frames),
        "first_render_ms_all": [round(v, 1) for v in renders],
        "update_apply_ms": median(applies),
        "update_frame_ms": median(update_frames),
        "update_latency_ms": median(latencies),
        "update_frame_ms_all": [round(v, 1) for v in update_frames],
        "update_latency_ms_all": [round(v, 1) for v in latencies],
    }


def main(argv: list[str] | None = None) -> None:
    """Build the run, serve its dashboard, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, required=True, help="new folder for the database")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True)
    with open_database(f"sqlite:///{args.out / 'run.db'}") as db:
        t0 = time.perf_counter()
        run_id = build_run(db, args.rounds, args.clients)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        history = load_history(db, run_id)
        history_s = time.perf_counter() - t0
        with db.session() as session:
            nodes = [node.id for node in queries.run_nodes(session, run_id)]
    registry = Registry(heartbeat_interval_s=3600.0)
    for node in nodes:
        name = history.clients[node][FIELD["name"]]
        registry.add(node, name, REGIONS[node % len(REGIONS)], {})
    dashboard = Dashboard(DashboardConfig(address="127.0.0.1:0"), history, registry, None)
    dashboard.start()
    try:
        snapshot_bytes = len(dashboard.live.snapshot_json())
        result: dict[str, Any] = {
            "rounds": args.rounds,
            "clients": args.clients,
            "repeats": args.repeats,
            "build_s": round(build_s, 1),
            "load_history_s": round(history_s, 3),
            "snapshot_bytes": snapshot_bytes,
        }
        result.update(measure(dashboard, nodes, args.repeats, args.rounds))
    finally:
        dashboard.close("completed")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
