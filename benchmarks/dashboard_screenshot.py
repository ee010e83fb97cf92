"""The README's dashboard screenshot: the quickstart (real digits data) watched live.

Runs ``geofl simulate -c examples/quickstart/run.yaml`` with 8 clients, 6 a round, for
40 rounds, on a throwaway database, with ``server.dashboard`` on loopback (a simulation
without the control API asks for no login there), and saves the page in headless
Chromium once ``--at`` rounds have committed.

Run: ``python -m benchmarks.dashboard_screenshot --out docs/images/dashboard.png``
(needs ``chromium`` and ``chromium-driver``).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.core import REPO_ROOT, free_port, stop_tree, wait_for_port
from benchmarks.dashboard_render import browser

ROUNDS = 40

__all__ = ["main"]


def simulate(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """The quickstart with its dashboard on ``port``, recording under ``workdir``."""
    overrides = {
        "run.rounds": ROUNDS,
        "run.name": "digits-demo",
        "server.dashboard.address": f"127.0.0.1:{port}",
        "storage.url": f"sqlite:///{workdir / 'demo.db'}",
        "simulation.clients": 8,
        "strategy.clients_per_round": 6,
    }
    command = [str(REPO_ROOT / ".venv" / "bin" / "geofl"), "simulate"]
    command += ["-c", str(REPO_ROOT / "examples" / "quickstart" / "run.yaml")]
    for key, value in overrides.items():
        command += ["--set", f"{key}={value}"]
    log = (workdir / "simulate.log").open("wb")
    return subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)


def committed(page_text: str) -> int:
    """The rounds the page's header says are committed."""
    found = re.search(rf"committed (\d+) / {ROUNDS}", page_text)
    return int(found.group(1)) if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--at", type=int, default=32, help="committed rounds to wait for")
    args = parser.parse_args(argv)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        run = simulate(port, Path(tmp))
        try:
            wait_for_port(port, 300)
            page = browser()
            try:
                page.get(f"http://127.0.0.1:{port}/")
                while committed(page.find_element("tag name", "body").text) < args.at:
                    if run.poll() is not None:
                        raise SystemExit(f"the simulation ended first (exit {run.returncode})")
                    time.sleep(0.5)
                time.sleep(0.5)  # the next delta's frame
                page.save_screenshot(str(args.out))
            finally:
                page.quit()
        finally:
            stop_tree(run.pid)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
