"""Distributed DP: its accounting, and the configurations refused before a run starts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from geofl.server.config import ConfigError, parse_config
from geofl.server.coordinator import build_strategy, distributed_plan
from geofl.server.privacy import (
    DistributedMechanism,
    PrivacyError,
    RoundMechanism,
    calibrate_distributed,
    epsilon,
)
from geofl.server.privacy.budget import PrivacyLedger
from geofl.server.strategies.robust import RobustStrategy

SECURE = {"enabled": True, "degree": "full"}
BASE: dict[str, Any] = {
    "run": {"name": "ddp", "rounds": 10},
    "model": "m:f",
    "strategy": {"clients_per_round": 10, "min_clients": 5},
}
PRIVACY = {"clip_norm": 1.0, "noise_multiplier": 1.0}


def config(privacy: dict[str, Any], **sections: Any) -> Any:
    sections.setdefault("secure_aggregation", SECURE)
    return parse_config({**BASE, **sections, "privacy": {**PRIVACY, **privacy}})


def refused(privacy: dict[str, Any], **sections: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config(privacy, **sections)
    return str(info.value)


# ------------------------------------------------------------------ accounting


def test_epsilon_is_the_continuous_gaussians_plus_the_rounding_inflation() -> None:
    """With a 32-bit ring the grid is fine: ε is within 0.1 % of the Gaussian's, never below."""
    central = epsilon(RoundMechanism(1.0), 20, 1e-5)
    for bits in (32, 20, 16):
        mechanism = DistributedMechanism(1.0, 1.0, 90, 100, 7850, bits)
        spent = epsilon(mechanism, 20, 1e-5)
        assert spent >= central
        assert spent < central * (1.001 if bits == 32 else 1.01)
        assert mechanism.rounding_bound > mechanism.clip_norm / mechanism.granularity
        assert mechanism.tau < 1e-12  # noise of hundreds of steps: the sum is Gaussian-like


def test_coarse_grids_and_few_steps_of_noise_cost_epsilon() -> None:
    fine = DistributedMechanism(1.0, 1.0, 10, 10, 1000, 32)
    coarse = DistributedMechanism(1.0, 1.0, 10, 10, 1000, 12)
    assert coarse.noise_stddev < fine.noise_stddev
    assert epsilon(coarse, 5, 1e-5) > epsilon(fine, 5, 1e-5)


def test_fewer_survivors_means_more_noise_per_client() -> None:
    strict = DistributedMechanism(1.0, 1.0, 100, 100, 1000, 32)
    tolerant = DistributedMechanism(1.0, 1.0, 80, 100, 1000, 32)
    assert tolerant.local_stddev == pytest.approx(strict.local_stddev * math.sqrt(100 / 80))
    # Accounted for its 80 survivors, the round is as private as the strict one.
    assert epsilon(tolerant, 3, 1e-5) == pytest.approx(epsilon(strict, 3, 1e-5), rel=1e-3)


def test_calibration_finds_the_noise_for_the_target() -> None:
    template = DistributedMechanism(1.0, 1.0, 50, 50, 7850, 32)
    tuned = calibrate_distributed(template, 3.0, 1e-5, 20)
    assert epsilon(tuned, 20, 1e-5) <= 3.0 * (1 + 1e-6)
    assert epsilon(tuned.with_noise(tuned.noise_multiplier * 0.99), 20, 1e-5) > 3.0


def test_the_ledger_accounts_a_distributed_mechanism() -> None:
    mechanism = DistributedMechanism(2.0, 1.0, 10, 10, 100, 32)
    ledger = PrivacyLedger(mechanism, 1e-5, target=epsilon(mechanism, 2, 1e-5))
    assert ledger.epsilon_after(2) == epsilon(mechanism, 2, 1e-5)
    assert ledger.over_budget(2) is None
    assert ledger.over_budget(3) is not None


def test_the_plan_holds_every_client_parameter() -> None:
    cfg = config({"min_survivors": 8})
    mechanism, settings = distributed_plan(cfg, 7850)
    assert settings.min_survivors == 8 and settings.denominator == 10
    assert settings.noise_stddev == mechanism.noise_stddev >= 1
    assert settings.granularity == mechanism.granularity
    assert not isinstance(build_strategy(cfg), RobustStrategy)  # clients clip, not the server


# ------------------------------------------------------------------ refusals


def test_auto_picks_distributed_with_secure_aggregation() -> None:
    cfg = config({})
    assert cfg.privacy.is_distributed(True)
    plain = config({}, secure_aggregation={"enabled": False})
    assert not plain.privacy.is_distributed(False)


@pytest.mark.parametrize(
    ("privacy", "sections", "needle"),
    [
        ({"mechanism": "central"}, {}, "mechanism central cannot be combined"),
        (
            {"mechanism": "distributed"},
            {"secure_aggregation": {"enabled": False}},
            "needs secure_aggregation.enabled",
        ),
        ({}, {"compression": {"up": "fp16"}}, "compression.up cannot be combined"),
        (
            {},
            {"secure_aggregation": {**SECURE, "low_rank": {"rank": 2}}},
            "secure_aggregation.low_rank",
        ),
        (
            {},
            {
                "strategy": {"clients_per_round": 200, "min_clients": 5},
                "secure_aggregation": {**SECURE, "ring_bits": 8},
            },
            "8-bit ring cannot hold the sum of 200",
        ),
        ({"adaptive": {}}, {}, "adaptive clipping) is not built for distributed DP"),
        ({"sampling": "uniform", "population": 100}, {}, "sampling uniform is refused"),
        ({"min_survivors": 11}, {}, "min_survivors 11 exceeds strategy.clients_per_round 10"),
        (
            {"noise_multiplier": 0.3, "target_epsilon": 1.0},
            {},
            "exceeded at round 1 already",
        ),
    ],
)
def test_bad_combinations_are_refused(
    privacy: dict[str, Any], sections: dict[str, Any], needle: str
) -> None:
    assert needle in refused(privacy, **sections)


def test_the_exact_budget_check_uses_the_model_size() -> None:
    """The config checks the Gaussian's ε (a lower bound); the plan checks the exact one."""
    z = 2.0
    gaussian = epsilon(RoundMechanism(z), 10, 1e-5)
    cfg = config(
        {"noise_multiplier": z, "target_epsilon": gaussian * (1 + 1e-5)},
        secure_aggregation={**SECURE, "ring_bits": 16},
    )
    with pytest.raises(PrivacyError, match="only 9 rounds fit"):
        distributed_plan(cfg, 7850)
