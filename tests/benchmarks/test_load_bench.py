"""The load benchmark's crowd joins with keys, stays connected, and the real rounds commit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import load
from benchmarks.load import run_case


def test_an_authenticated_crowd_is_held_while_real_clients_train() -> None:
    case = run_case(crowd=20, rounds=2, crowd_processes=1, auth=True)
    assert case["server_exit"] == 0
    assert case["joined"] == 20
    assert case["crowd_healthy_min"] == 20
    assert case["crowd_taken_offline"] == 0
    assert case["crowd_call_failures"] == {}
    assert len(case["round_s"]) == 2


def test_split_cpus_pins_a_child_and_its_threads() -> None:
    script = (
        "import os, threading; t = threading.Thread(target=lambda: None); t.start(); "
        "print(sorted(os.sched_getaffinity(0)))"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=load._pinned(load.SERVER_CPUS),
    )
    assert child.stdout.strip() == str(sorted(load.SERVER_CPUS))
    assert load._pinned(None) is None


def test_offline_crowd_nodes_are_counted_from_the_server_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "INFO node 7 (crowd-3) went offline\n"
        "INFO node 8 (real-0) went offline\n"
        "INFO node 9 (crowd-4) joined\n"
    )
    assert load._offline_crowd_nodes(log) == 1
