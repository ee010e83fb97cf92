"""The ``privacy`` section: validation, composition, and the budget checked before a run."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from geofl.server.config import parse_config
from geofl.server.config.errors import ConfigError
from geofl.server.coordinator import build_strategy
from geofl.server.privacy import GaussianClip, RoundMechanism, epsilon
from geofl.server.strategies.robust import RobustStrategy

BASE: dict[str, Any] = {
    "run": {"name": "dp", "rounds": 10},
    "model": "m:f",
    "strategy": {"clients_per_round": 10, "min_clients": 5},
}


def config(privacy: dict[str, Any], **sections: Any) -> Any:
    return parse_config({**BASE, **sections, "privacy": privacy})


def refused(privacy: dict[str, Any], **sections: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config(privacy, **sections)
    return str(info.value)


def test_fixed_clip_builds_the_dp_rule_behind_the_optimizer() -> None:
    cfg = config({"clip_norm": 0.5, "noise_multiplier": 1.2})
    strategy = build_strategy(cfg)
    assert isinstance(strategy, RobustStrategy) and isinstance(strategy.rule, GaussianClip)
    assert strategy.rule.hyperparameters() == {
        "clip_norm": 0.5,
        "noise_multiplier": 1.2,
        "denominator": 10,
    }
    assert cfg.privacy is not None and cfg.privacy.delta == 1e-5


def test_adaptive_defaults_to_count_noise_of_a_twentieth_of_the_cohort() -> None:
    cfg = config({"clip_norm": 0.5, "noise_multiplier": 1.2, "adaptive": {}})
    rule = build_strategy(cfg).rule  # type: ignore[attr-defined]
    assert rule.count_noise_multiplier == 0.5 and rule.target_quantile == 0.5


def test_target_epsilon_alone_calibrates_the_noise() -> None:
    cfg = config({"clip_norm": 1.0, "target_epsilon": 4.0})
    rule = build_strategy(cfg).rule  # type: ignore[attr-defined]
    assert epsilon(RoundMechanism(rule.noise_multiplier), 10, 1e-5) <= 4.0 + 1e-6


def test_target_exceeded_at_round_one_is_refused() -> None:
    message = refused({"clip_norm": 1.0, "noise_multiplier": 0.3, "target_epsilon": 1.0})
    assert "exceeded at round 1" in message and "noise_multiplier 0.3" in message


def test_planned_rounds_over_the_target_are_refused_with_how_many_fit() -> None:
    z, target = 2.0, 3.0
    message = refused({"clip_norm": 1.0, "noise_multiplier": z, "target_epsilon": target})
    fit = max(r for r in range(1, 11) if epsilon(RoundMechanism(z), r, 1e-5) <= target)
    assert f"only {fit} rounds fit" in message and "on_budget: stop" in message


def test_on_budget_stop_lets_the_run_start() -> None:
    privacy = {"clip_norm": 1.0, "noise_multiplier": 2.0, "target_epsilon": 3.0}
    assert config({**privacy, "on_budget": "stop"}).privacy is not None


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"schedule": {"mode": "async"}}, "schedule.mode sync"),
        (
            {
                "strategy": {
                    "clients_per_round": 10,
                    "min_clients": 5,
                    "robust": {"name": "median", "byzantine": 1},
                }
            },
            "strategy.robust (median)",
        ),
        ({"strategy": {"flower": "FedAvg", "clients_per_round": 10}}, "geofl strategy"),
        (
            {
                "simulation": {
                    "clients": 10,
                    "relays": True,
                    "regions": {"eu": {"share": 1.0, "rtt_ms": 10, "up_mbps": 10, "down_mbps": 10}},
                }
            },
            "simulation.relays",
        ),
    ],
)
def test_compositions_that_would_be_accounted_wrongly(sections: Any, needle: str) -> None:
    assert needle in refused({"clip_norm": 1.0, "noise_multiplier": 1.0}, **sections)


def test_missing_dp_accounting_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import now raises ImportError
    assert "pip install 'geofl[privacy]'" in refused({"clip_norm": 1.0, "noise_multiplier": 1.0})


def test_uniform_sampling_needs_a_uniform_sample() -> None:
    privacy = {"clip_norm": 1.0, "noise_multiplier": 1.0, "sampling": "uniform", "population": 100}
    assert config(privacy).privacy is not None
    schedule = {"selection": {"policy": "deadline"}, "over_select": 1.5}
    message = refused(privacy, schedule=schedule)
    assert "policy is 'deadline'" in message and "over_select" in message
    assert "population" in refused({**privacy, "population": None})
    assert "exceeds privacy.population 5" in refused({**privacy, "population": 5})


def test_compression_composes_with_central_dp() -> None:
    """The server clips the decoded update, so an upload codec changes nothing here."""
    cfg = config(
        {"clip_norm": 1.0, "noise_multiplier": 1.0},
        compression={"up": [{"topk": {"ratio": 0.1}}]},
    )
    assert cfg.privacy is not None


@pytest.mark.parametrize(
    ("privacy", "needle"),
    [
        ({"clip_norm": 1.0}, "noise_multiplier, target_epsilon or both"),
        ({"clip_norm": 0.0, "noise_multiplier": 1.0}, "greater than 0"),
        ({"clip_norm": 1.0, "noise_multiplier": 1.0, "delta": 1.0}, "less than 1"),
        ({"clip_norm": 1.0, "noise_multiplier": 1.0, "population": 50}, "sampling: uniform"),
        (
            {"clip_norm": 1.0, "noise_multiplier": 1.0, "adaptive": {"target_quantile": 1}},
            "less than 1",
        ),
        ({"clip_norm": 1.0, "noise_multiplier": 1.0, "nois": 1}, "nois"),
    ],
)
def test_bad_settings_are_named(privacy: dict[str, Any], needle: str) -> None:
    assert needle in refused(privacy)


def test_privacy_is_part_of_the_run_identity() -> None:
    plain = parse_config(BASE)
    assert plain.to_dict()["privacy"] is None
    with_privacy = config({"clip_norm": 1.0, "noise_multiplier": 1.0})
    assert with_privacy.to_dict()["privacy"]["clip_norm"] == 1.0
    assert plain.config_sha256() != with_privacy.config_sha256()
