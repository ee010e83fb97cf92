"""Checks made before a simulation starts: cohort size, trace file, link model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from geofl.server.config import ConfigError, parse_config
from geofl.server.simulation.preflight import check_simulation, simulation_problems

TRACE = {
    "format": "geofl-client-trace",
    "version": 1,
    "device_capacity": {"1": {"computation": 10.0, "communication": 2000.0}},
}


def _config(tmp_path: Path, **simulation: Any) -> Any:
    return parse_config(
        {
            "run": {"name": "x"},
            "model": "m:f",
            "strategy": {"clients_per_round": 4, "min_clients": 2},
            "simulation": {"clients": 4, **simulation},
        },
        base_dir=tmp_path,
    )


def _trace(tmp_path: Path, document: dict[str, Any]) -> str:
    (tmp_path / "t.json").write_text(json.dumps(document))
    return "t.json"


def test_a_sound_simulation_passes_and_returns_its_trace(tmp_path: Path) -> None:
    assert check_simulation(_config(tmp_path), "run.yaml") is None
    trace = check_simulation(_config(tmp_path, trace=_trace(tmp_path, TRACE)), "run.yaml")
    assert trace is not None and len(trace.capacities) == 1


def test_more_clients_per_round_than_exist(tmp_path: Path) -> None:
    config = _config(tmp_path, clients=3)
    with pytest.raises(ConfigError) as caught:
        check_simulation(config, "run.yaml")
    assert str(caught.value) == (
        "run.yaml: strategy.clients_per_round: more clients per round than exist: 4 per "
        "round but simulation.clients is 3; lower clients_per_round or simulate more clients"
    )


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    broken = {**TRACE, "device_capacity": {"9": {"computation": 0, "communication": 1}}}
    config = _config(tmp_path, clients=3, trace=_trace(tmp_path, broken))
    problems, trace = simulation_problems(config, "run.yaml")
    assert trace is None
    assert [p.path for p in problems] == ["strategy.clients_per_round", "simulation.trace"]
    assert "client '9': computation: must be > 0" in problems[1].message


def test_a_trace_without_speeds_needs_regions(tmp_path: Path) -> None:
    windows = {
        **TRACE,
        "device_capacity": {},
        "behave_trace": {"1": {"active": [0], "inactive": [10]}},
    }
    config = _config(tmp_path, trace=_trace(tmp_path, windows))
    problems, trace = simulation_problems(config, "run.yaml")
    assert trace is not None
    assert [p.path for p in problems] == ["simulation.regions"]
    assert "gives no communication speed" in problems[0].message
    regions = {"all": {"share": 1.0, "rtt_ms": 10, "up_mbps": 1, "down_mbps": 1}}
    assert simulation_problems(_config(tmp_path, trace="t.json", regions=regions), "r")[0] == []
