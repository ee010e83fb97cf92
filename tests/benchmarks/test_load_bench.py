"""The load benchmark's crowd joins with keys, stays connected, and the real rounds commit."""

from __future__ import annotations

from benchmarks.load import run_case


def test_an_authenticated_crowd_is_held_while_real_clients_train() -> None:
    case = run_case(crowd=20, rounds=2, crowd_processes=1, auth=True)
    assert case["server_exit"] == 0
    assert case["joined"] == 20
    assert case["crowd_healthy_min"] == 20
    assert len(case["round_s"]) == 2
