"""Distributed DP under secure aggregation end to end: on the virtual clock and over gRPC.

The test app's clients add ``1 + partition`` to each of the 15 floats, so with
``clip_norm`` 1 every update is clipped to ``1 / sqrt(15)`` per coordinate; the noised
mean over ``clients_per_round`` survivors is that plus discrete Gaussian noise of std
``z C / clients_per_round`` on each coordinate (the rotation keeps the noise isotropic).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.server.config import ConfigError, RunConfig
from geofl.server.coordinator import Coordinator
from geofl.server.privacy import DistributedMechanism, epsilon
from geofl.server.simulation.virtual import run_virtual_simulation
from geofl.storage import open_database, queries

from .conftest import final_weights, run_config, run_rows

FLOATS = 15


def recorded_epsilons(config: RunConfig) -> list[float | None]:
    db = open_database(config.storage.url)
    try:
        with db.session() as session:
            return [r.epsilon for r in queries.rounds_of(session, 1)]
    finally:
        db.close()


def _config(tmp_path: Path, clients: int, rounds: int, z: float, **sections: Any) -> RunConfig:
    base: dict[str, Any] = {
        "run": {"name": "ddp", "rounds": rounds, "seed": 5},
        "model": "geofl_testapp:make_float_model",
        "strategy": {"name": "fedavg", "clients_per_round": clients, "min_clients": clients},
        "secure_aggregation": {"enabled": True, "degree": "full", "stage_deadline_s": 20},
        "privacy": {"clip_norm": 1.0, "noise_multiplier": z, "delta": 1e-5},
        "evaluation": {"every": 0},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return run_config(tmp_path, **base)


def _check_noised_mean(config: RunConfig, clients: int, rounds: int, z: float) -> None:
    """Each round moves every coordinate by 1/sqrt(15) plus noise of std z / clients."""
    weights = final_weights(config)
    moved = np.concatenate([weights["w"].ravel(), weights["b"].ravel()])
    expected = rounds / math.sqrt(FLOATS)
    noise = z / clients * math.sqrt(rounds)
    assert np.all(np.abs(moved - expected) < 6 * noise), (moved, expected, noise)
    assert abs(float(moved.mean()) - expected) < 6 * noise / math.sqrt(FLOATS)


def _expected_epsilons(clients: int, rounds: int, z: float) -> list[float]:
    mechanism = DistributedMechanism(z, 1.0, clients, clients, FLOATS, 32)
    return [epsilon(mechanism, n, 1e-5) for n in range(1, rounds + 1)]


def test_distributed_dp_over_secagg_on_the_virtual_clock(tmp_path: Path) -> None:
    clients, rounds, z = 10, 3, 0.5
    config = _config(
        tmp_path,
        clients,
        rounds,
        z,
        schedule={"deadline_s": 600, "wait_for_clients_s": 5},
        simulation={
            "clients": clients,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
        },
    )
    outcome = run_virtual_simulation(config)
    assert outcome.result.status == "completed", outcome.result
    _check_noised_mean(config, clients, rounds, z)
    assert recorded_epsilons(config) == pytest.approx(_expected_epsilons(clients, rounds, z))


def test_distributed_dp_over_grpc_loopback(tmp_path: Path, serve: Any) -> None:
    clients, rounds, z = 3, 2, 0.5
    config = _config(
        tmp_path,
        clients,
        rounds,
        z,
        schedule={"deadline_s": 30, "wait_for_clients_s": 30},
    )
    handle = serve(config)
    for partition in range(clients):
        handle.add_client(partition)
    result = handle.wait(timeout=90)
    assert result.status == "completed", result
    _check_noised_mean(config, clients, rounds, z)
    assert recorded_epsilons(config) == pytest.approx(_expected_epsilons(clients, rounds, z))


def test_a_target_exceeded_at_round_one_is_refused_before_the_run(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exceeded at round 1"):
        _config(tmp_path, 4, 3, 0.3, privacy={"target_epsilon": 1.0})


def test_a_ring_too_small_for_the_noise_is_refused_once_the_model_is_known(
    tmp_path: Path,
) -> None:
    """15 floats in an 8-bit ring: the grid step is coarser than each client's noise."""
    config = _config(tmp_path, 10, 2, 0.3, secure_aggregation={"ring_bits": 8})
    with pytest.raises(ConfigError, match="8-bit ring is too small for this noise"):
        Coordinator(config, listen=False)


@pytest.mark.parametrize(("min_survivors", "status"), [(None, "failed"), (3, "committed")])
def test_a_dropout_below_min_survivors_aborts_the_round(
    tmp_path: Path, min_survivors: int | None, status: str
) -> None:
    """One client of four fails its fit: with the default (every client must survive) the
    round is aborted before unmasking; with min_survivors 3 it commits, accounted for 3."""
    privacy = {} if min_survivors is None else {"min_survivors": min_survivors}
    config = _config(
        tmp_path,
        4,
        1,
        0.5,
        privacy=privacy,
        strategy={"min_clients": 3},
        schedule={"deadline_s": 600, "wait_for_clients_s": 5},
        simulation={
            "clients": 4,
            "app": "geofl_testapp:virtual_app",
            "clock": "virtual",
            "workers": 0,
            "node_config": {"raise-ids": "2"},
        },
    )
    outcome = run_virtual_simulation(config)
    _, rounds, _ = run_rows(config)
    assert [r.status for r in rounds] == [status], outcome.result
    if status == "failed":
        assert "fewer than privacy.min_survivors 4" in (rounds[0].error or "")
    else:
        expected = DistributedMechanism(0.5, 1.0, 3, 4, FLOATS, 32)
        assert recorded_epsilons(config) == pytest.approx([epsilon(expected, 1, 1e-5)])
