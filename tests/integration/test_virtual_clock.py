"""The real coordinator on the virtual clock with simulated clients (no gRPC, no sleeping).

Durations are checked against the link model computed independently here: a fit's
recorded duration is its download + compute + upload exactly, a round with a deadline
lasts exactly the deadline, and stragglers, crashes, NaN updates and availability windows
become the same participation outcomes as on the wall clock.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.server.config import ConfigError, RunConfig
from geofl.server.simulation.fleet import upload_seed
from geofl.server.simulation.traces import load_trace
from geofl.server.simulation.virtual import VirtualRun, run_virtual_simulation
from geofl.storage.models import Participation, Round
from tests.integration.conftest import (
    STORED_DURATION_ABS,
    final_weights,
    link_model,
    run_config,
    run_rows,
)

REGIONS = {
    "near": {"share": 0.5, "rtt_ms": 20, "up_mbps": 8, "down_mbps": 40},
    "far": {"share": 0.5, "rtt_ms": 200, "up_mbps": 0.5, "down_mbps": 2},
}
# 4x3 + 3 float32 + one int64 = 68 bytes a model: transfers take a little serialization time.
SPEED = 1000.0  # samples per second; each client trains on 100 examples -> 0.1 s


def _virtual(tmp_path: Path, **overrides: Any) -> RunConfig:
    simulation: dict[str, Any] = {
        "clients": 8,
        "app": "geofl_testapp:virtual_app",
        "clock": "virtual",
        "workers": 0,
        "regions": REGIONS,
        "compute": {"samples_per_s": SPEED},
    }
    simulation.update(overrides.pop("simulation", {}))
    sections: dict[str, Any] = {
        "strategy": {"name": "fedavg", "clients_per_round": 8, "min_clients": 2},
        "schedule": {"deadline_s": 600, "wait_for_clients_s": 5},
        "evaluation": {"every": 0, "server": "geofl_testapp:server_evaluate"},
        "simulation": simulation,
    }
    sections.update(overrides)
    return run_config(tmp_path, **sections)


def test_durations_follow_the_link_model_exactly(tmp_path: Path) -> None:
    config = _virtual(tmp_path)
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed"
    run, rounds, pairs = run_rows(config)
    assert run.simulated_clock is True
    links = link_model(config)
    fits = [(p, n) for p, n in pairs if p.kind == "fit"]
    assert len(fits) == 16 and all(p.status == "ok" for p, _ in fits)
    for participation, node in fits:
        link = links.link(int(node.name.removeprefix("sim-")))
        expected = (
            link.fetch_s(participation.bytes_down)
            + 100 / SPEED
            + link.upload_s(participation.bytes_up)
        )
        assert participation.duration_s == pytest.approx(expected, abs=STORED_DURATION_ABS)
        assert participation.compute_s == pytest.approx(100 / SPEED)
    # The round lasts as long as its slowest client (plus zero server time).
    for number in (1, 2):
        slowest = max(p.duration_s or 0 for p, _ in fits if _round_of(p, rounds) == number)
        round_row = rounds[number - 1]
        assert round_row.duration_s == pytest.approx(slowest, abs=2 * STORED_DURATION_ABS)
    # Round 2's downloads are differences against round 1's model: both sizes recorded.
    assert all(p.bytes_down > 0 for p, _ in fits)
    stored = sum(r.duration_s or 0 for r in rounds)
    assert outcome.simulated_s == pytest.approx(stored, abs=len(rounds) * STORED_DURATION_ABS)


def _round_of(participation: Participation, rounds: list[Round]) -> int:
    return next(r.number for r in rounds if r.id == participation.round_id)


def test_aggregate_equals_fedavg_of_the_clients(tmp_path: Path) -> None:
    config = _virtual(tmp_path, run={"name": "itest", "rounds": 1, "seed": 1})
    run_virtual_simulation(config)
    weights = final_weights(config)
    # Every client adds 1 + index with equal weight: the mean shift is 1 + mean(0..7) = 4.5.
    assert np.allclose(weights["w"], 4.5)


def test_stragglers_miss_the_deadline_in_simulated_time(tmp_path: Path) -> None:
    # Far clients need > 0.2 s for latency alone; near ones finish in ~0.12 s.
    config = _virtual(tmp_path, schedule={"deadline_s": 0.15, "wait_for_clients_s": 5})
    run_virtual_simulation(config)
    _, rounds, pairs = run_rows(config)
    statuses = {(n.region, p.status) for p, n in pairs if p.kind == "fit"}
    assert statuses == {("near", "ok"), ("far", "late")}
    assert all(r.status == "committed" for r in rounds)
    # Stored to the microsecond: the round's start and end each round once (< 2 us).
    assert [r.duration_s for r in rounds] == pytest.approx([0.15, 0.15], abs=2e-6)


def test_failures_and_nan_updates_are_recorded_not_applied(tmp_path: Path) -> None:
    config = _virtual(
        tmp_path,
        run={"name": "itest", "rounds": 1, "seed": 1},
        simulation={"node_config": {"raise-ids": "0", "nan-ids": "1"}},
    )
    run_virtual_simulation(config)
    _, _, pairs = run_rows(config)
    by_client = {n.name: p for p, n in pairs if p.kind == "fit"}
    assert by_client["sim-0"].status == "failed"
    assert "deliberate failure in fit" in (by_client["sim-0"].reason or "")
    assert by_client["sim-1"].status == "rejected"
    assert "NaN" in (by_client["sim-1"].reason or "")
    # The other six (shifts 3..8) are averaged: 5.5.
    assert np.allclose(final_weights(config)["w"], 5.5)


def test_availability_trace_drops_clients_mid_round(tmp_path: Path) -> None:
    # Clients 0-3 are online for the first 0.05 s only, then never again.
    # FedScale's units: ms per inference (a step is 3 of them), kbit/s of 1024 bit.
    behaviour = {str(i): {"active": [0.0], "inactive": [0.05 if i < 4 else 1e9]} for i in range(8)}
    capacity = {str(i): {"computation": 1 / 3, "communication": 8000} for i in range(8)}
    trace = tmp_path / "trace.json"
    document = {"format": "geofl-client-trace", "version": 1}
    document |= {"device_capacity": capacity, "behave_trace": behaviour}
    trace.write_text(json.dumps(document))
    parsed = load_trace(trace)
    config = _virtual(
        tmp_path,
        run={"name": "itest", "rounds": 2, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 4, "min_clients": 2},
        simulation={"trace": str(trace), "regions": {}},
    )
    run_virtual_simulation(config, parsed)
    _, rounds, pairs = run_rows(config)
    first = [p for p, _ in pairs if p.kind == "fit" and p.round_id == rounds[0].id]
    dropped = [p for p in first if p.status == "dropped"]
    assert dropped and all("availability trace" in (p.reason or "") for p in dropped)
    # In round 2 the offline clients cannot be selected any more.
    second = [n.name for p, n in pairs if p.kind == "fit" and p.round_id == rounds[1].id]
    assert second and all(int(name.removeprefix("sim-")) >= 4 for name in second)


def test_worker_processes_give_the_same_run_as_in_process(tmp_path: Path) -> None:
    inline = _virtual(tmp_path / "inline")
    processes = _virtual(tmp_path / "processes", simulation={"workers": 2})
    first: VirtualRun = run_virtual_simulation(inline)
    second: VirtualRun = run_virtual_simulation(processes)
    assert first.simulated_s == pytest.approx(second.simulated_s, abs=1e-9)
    assert np.array_equal(final_weights(inline)["w"], final_weights(processes)["w"])
    assert first.stats.bytes_up == second.stats.bytes_up


def test_compressed_uploads_are_smaller_and_take_less_time(tmp_path: Path) -> None:
    one_round = {"name": "itest", "rounds": 1, "seed": 1}
    model = "geofl_testapp:make_medium_model"
    plain = _virtual(tmp_path / "plain", run=one_round, model=model)
    compressed = _virtual(tmp_path / "fp16", run=one_round, model=model, compression={"up": "fp16"})
    run_virtual_simulation(plain)
    run_virtual_simulation(compressed)
    plain_fits = {n.name: p for p, n in run_rows(plain)[2] if p.kind == "fit"}
    small_fits = {n.name: p for p, n in run_rows(compressed)[2] if p.kind == "fit"}
    for name, participation in small_fits.items():
        assert participation.bytes_up < plain_fits[name].bytes_up
        assert participation.bytes_up_raw == plain_fits[name].bytes_up_raw
        assert (participation.duration_s or 0) < (plain_fits[name].duration_s or 0)


def test_stochastic_upload_codecs_give_the_same_run_twice(tmp_path: Path) -> None:
    """Stochastic rounding is seeded by the run's seed, the client and its job count, not
    by the task id (made from the coordinator's wall clock): a simulation repeats exactly."""
    model = "geofl_testapp:make_medium_model"
    int4 = {"up": [{"qsgd": {"bits": 4}}], "error_feedback": True}
    ramp = {"app": "geofl_testapp:ramp_app"}
    runs = [
        _virtual(
            tmp_path / name,
            simulation=ramp,
            run={"name": "itest", "rounds": 2, "seed": seed},
            model=model,
            compression=int4,
        )
        for name, seed in (("first", 1), ("again", 1), ("other-seed", 2))
    ]
    for config in runs:
        run_virtual_simulation(config)
    first, again, other = (final_weights(config) for config in runs)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name], err_msg=name)
    assert any(not np.array_equal(first[n], other[n]) for n in first)  # the seed matters


def test_upload_seeds_differ_by_client_and_job() -> None:
    seeds = {upload_seed(1, client, job) for client in range(50) for job in range(1, 50)}
    assert len(seeds) == 50 * 49
    assert all(0 <= seed < 2**64 for seed in seeds)
    assert upload_seed(1, 3, 7) == upload_seed(1, 3, 7) != upload_seed(2, 3, 7)


def test_secure_aggregation_runs_on_the_virtual_clock(tmp_path: Path) -> None:
    """SecAgg+'s stages are served by the virtual clients: the unmasked mean is FedAvg's."""
    config = _virtual(
        tmp_path,
        secure_aggregation={"enabled": True, "degree": "full", "max_examples": 100},
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed", outcome.result
    shift = float(np.mean([1.0 + p for p in range(8)]))  # equal weights: 100 examples each
    weights = final_weights(config)
    np.testing.assert_allclose(weights["w"], np.full((4, 3), 2 * shift), atol=1e-4)
    _, _, pairs = run_rows(config)
    kinds = {p.kind for p, _ in pairs}
    assert {"advertise", "share", "fit", "unmask"} <= kinds


def test_secure_aggregation_with_virtual_relays_is_refused_before_starting(
    tmp_path: Path,
) -> None:
    config = _virtual(
        tmp_path,
        secure_aggregation={"enabled": True},
        simulation={"relays": True, "regions": REGIONS},
    )
    with pytest.raises(ConfigError, match=r"secure_aggregation\.enabled"):
        run_virtual_simulation(config)
    assert not (tmp_path / "geofl.db").exists()


def test_the_simulators_partition_reaches_every_client(tmp_path: Path) -> None:
    config = _virtual(
        tmp_path,
        run={"name": "itest", "rounds": 1, "seed": 1},
        simulation={
            "app": "geofl_testapp:partition_app",
            "labels": "geofl_testapp:labels",
            "partition": {"shards": {"per_client": 2}},
        },
    )
    run_virtual_simulation(config)
    fits = [p for p, _ in run_rows(config)[2] if p.kind == "fit"]
    # 80 samples, 16 shards of 5, two per client: 10 examples each, all ok.
    assert len(fits) == 8 and all(p.status == "ok" and p.num_examples == 10 for p in fits)
