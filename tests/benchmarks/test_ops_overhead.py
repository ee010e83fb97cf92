"""The ops-overhead benchmark's cases are valid runs, and its summary is the pairwise median."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.ops_overhead import case_config, overheads, run_case
from geofl.server.config import parse_config


@pytest.mark.parametrize("case", ["off", "metrics"])
def test_each_case_is_a_valid_virtual_run(tmp_path: Path, case: str) -> None:
    config = parse_config(case_config(case, 1000, 6, tmp_path), source=case)
    assert config.simulation.clock == "virtual" and config.strategy.clients_per_round == 1000
    assert (config.server.metrics is not None) == (case == "metrics")


def test_the_dashboard_case_serves_a_dashboard_and_the_metrics(tmp_path: Path) -> None:
    config = parse_config(case_config("dashboard", 10, 2, tmp_path), source="dashboard")
    assert config.server.dashboard is not None and config.server.metrics is not None
    assert config.server.dashboard.host == "127.0.0.1"  # no login: loopback only


def test_overhead_is_the_median_of_pairwise_ratios() -> None:
    def metrics(steady: float, observer: float) -> dict[str, float]:
        return {
            "steady_round_s": steady,
            "observer_s_per_round": observer,
            "scrape_cpu_s_per_round": 0.0,
        }

    repeats = [
        {"off": {"steady_round_s": 1.0}, "metrics": metrics(1.01, 0.01)},
        {"off": {"steady_round_s": 2.0}, "metrics": metrics(2.0, 0.01)},
        {"off": {"steady_round_s": 1.0}, "metrics": metrics(1.5, 0.02)},
    ]
    summary = overheads(repeats)
    assert summary["off"]["median_steady_round_s"] == 1.0
    assert summary["metrics"]["median_overhead"] == pytest.approx(0.01)
    assert summary["metrics"]["median_attributed_overhead"] == pytest.approx(0.01)
    assert "median_overhead" not in summary["off"]


def test_a_small_metrics_case_runs_and_is_scraped(tmp_path: Path) -> None:
    result = run_case(
        "metrics", clients=20, rounds=3, params=100, scrape_interval_s=0.05, root=tmp_path
    )
    assert result["status"] == "completed" and len(result["round_s"]) == 3
    assert result["steady_round_s"] > 0
    assert result["scrapes"] >= 1
    assert result["observer_s"] > 0  # the observer's own methods were timed
    assert result["scrape_cpu_s"] > 0  # and the endpoint's text generation
