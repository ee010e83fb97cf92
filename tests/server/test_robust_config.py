"""``strategy.robust``: every rule from YAML, and bad input refused before the run starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from geofl.server.config import ConfigError, load_config
from geofl.server.config.robust import regional_strategy
from geofl.server.coordinator import build_strategy
from geofl.server.relay import flag_override, load_relay_config
from geofl.server.simulation.commands import relay_command
from geofl.server.strategies import FedAdam, FedAvg
from geofl.server.strategies.robust import (
    AdaptiveClip,
    CenteredClip,
    CoordinateMedian,
    FixedClip,
    Krum,
    MultiKrum,
    RobustStrategy,
    TrimmedMean,
)

MINIMAL = "run: {name: demo}\nmodel: pkg.task:make_model\n"


def load(tmp_path: Path, strategy: str, extra: str = "") -> Any:
    path = tmp_path / "run.yml"
    path.write_text(MINIMAL + f"strategy: {strategy}\n" + extra)
    return load_config(path)


def problems(tmp_path: Path, strategy: str, extra: str = "") -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, strategy, extra)
    return str(info.value)


COHORT = "clients_per_round: 7, min_clients: 7"


@pytest.mark.parametrize(
    ("robust", "rule"),
    [
        ("{name: clip, clip_norm: 2.5}", FixedClip),
        ("{name: adaptive_clip, target_quantile: 0.7}", AdaptiveClip),
        ("{name: median, byzantine: 3}", CoordinateMedian),
        ("{name: trimmed_mean, byzantine: 2}", TrimmedMean),
        ("{name: krum, byzantine: 2}", Krum),
        ("{name: multi_krum, byzantine: 2, select: 5}", MultiKrum),
        ("{name: centered_clip, radius: 1.0, iterations: 2, byzantine: 3}", CenteredClip),
    ],
)
def test_each_rule_builds_in_front_of_the_optimizer(
    tmp_path: Path, robust: str, rule: type[Any]
) -> None:
    config = load(tmp_path, f"{{name: fedadam, {COHORT}, robust: {robust}}}")
    strategy = build_strategy(config)
    assert isinstance(strategy, RobustStrategy)
    assert isinstance(strategy.optimizer, FedAdam) and isinstance(strategy.rule, rule)
    assert config.to_dict()["strategy"]["robust"]["name"] == config.strategy.robust.name


def test_no_robust_section_is_the_plain_optimizer(tmp_path: Path) -> None:
    config = load(tmp_path, "{name: fedadam}")
    assert config.strategy.robust is None
    assert isinstance(build_strategy(config), FedAdam)


def test_spill_dir_resolves_against_the_file(tmp_path: Path) -> None:
    config = load(tmp_path, f"{{{COHORT}, robust: {{name: median, byzantine: 1, spill_dir: sp}}}}")
    assert config.strategy.robust.spill_dir == tmp_path / "sp"


@pytest.mark.parametrize(
    ("robust", "message"),
    [
        (
            "{name: krum, byzantine: 1}",
            "robust rule krum with byzantine 1 needs at least 5 updates per round "
            "(Krum needs n > 2f + 2), but min_clients is 4",
        ),
        (
            "{name: trimmed_mean, byzantine: 2}",
            "needs at least 5 updates per round (trimming f from each end needs 2f < n)",
        ),
        ("{name: median, byzantine: 2}", "the median tolerates f < n / 2"),
        ("{name: multi_krum, byzantine: 0, select: 5}", "select <= n - f"),
        ("{name: centered_clip, radius: 1, byzantine: 2}", "an honest majority, 2f < n"),
    ],
)
def test_more_attackers_than_the_breakdown_point_are_refused(
    tmp_path: Path, robust: str, message: str
) -> None:
    text = problems(tmp_path, f"{{clients_per_round: 4, min_clients: 4, robust: {robust}}}")
    assert message in text


def test_the_breakdown_point_counts_min_clients_not_the_target(tmp_path: Path) -> None:
    """A round commits with min_clients updates: the rule must hold for that many."""
    text = problems(
        tmp_path, "{clients_per_round: 10, min_clients: 3, robust: {name: krum, byzantine: 1}}"
    )
    assert "min_clients is 3 (clients_per_round 10)" in text


@pytest.mark.parametrize(
    ("robust", "message"),
    [
        ("{name: clip}", "strategy.robust.clip_norm: required key is missing"),
        ("{name: clip, clip_norm: 0}", "greater than 0"),
        ("{name: clip, clip_norm: .inf}", "finite number"),
        ("{name: adaptive_clip, target_quantile: 1}", "less than 1"),
        ("{name: median}", "strategy.robust.byzantine: required key is missing"),
        ("{name: median, byzantine: -1}", "greater than or equal to 0"),
        ("{name: krum, byzantine: 0, select: 2}", "select: unknown key"),
        ("{name: centered_clip, radius: 1, iterations: 0}", "greater than or equal to 1"),
        ("{name: mean}", "'mean' is not one of clip, adaptive_clip, median"),
    ],
)
def test_bad_settings_name_the_key(tmp_path: Path, robust: str, message: str) -> None:
    assert message in problems(tmp_path, f"{{{COHORT}, robust: {robust}}}")


def test_secure_aggregation_refuses_a_robust_rule(tmp_path: Path) -> None:
    text = problems(
        tmp_path,
        f"{{{COHORT}, robust: {{name: clip, clip_norm: 1}}}}",
        "secure_aggregation: {enabled: true}\n",
    )
    assert "strategy.robust (clip) cannot be combined with secure_aggregation" in text


@pytest.mark.parametrize("mode", ["async", "diloco"])
def test_only_synchronous_rounds_take_a_robust_rule(tmp_path: Path, mode: str) -> None:
    text = problems(
        tmp_path,
        f"{{{COHORT}, robust: {{name: median, byzantine: 1}}}}",
        f"schedule: {{mode: {mode}}}\n",
    )
    assert f"needs schedule.mode sync, not '{mode}'" in text


def test_a_flower_strategy_refuses_a_robust_rule(tmp_path: Path) -> None:
    text = problems(tmp_path, "{flower: FedAvg, robust: {name: median, byzantine: 0}}")
    assert "a robust rule cannot run in front of a Flower strategy" in text


# ------------------------------------------------------------------ regional rules (relays)

RELAY_FLAGS = [
    flag_override("--region", "relay.region", "eu"),
    flag_override("--server", "upstream.address", "coordinator:8443"),
    flag_override("--listen", "server.address", "127.0.0.1:9443"),
]


def test_a_relay_runs_its_regional_rounds_behind_the_rule() -> None:
    config = load_relay_config(
        flags=RELAY_FLAGS,
        overrides=["relay.min_clients=3", "relay.robust={name: median, byzantine: 1}"],
    )
    strategy = regional_strategy(config.relay.robust)
    assert isinstance(strategy, RobustStrategy) and isinstance(strategy.rule, CoordinateMedian)
    assert isinstance(regional_strategy(None), FedAvg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["relay.robust={name: krum, byzantine: 1}"],
            "needs at least 5 updates per round (Krum needs n > 2f + 2), but "
            "relay.min_clients is 1",
        ),
        (
            [
                "relay.min_clients=3",
                "relay.robust={name: clip, clip_norm: 1}",
                "secure_aggregation.enabled=true",
            ],
            "relay.robust (clip) cannot be combined with secure_aggregation",
        ),
    ],
)
def test_a_relay_refuses_a_rule_it_cannot_hold(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_relay_config(flags=RELAY_FLAGS, overrides=overrides)
    assert message in str(info.value)


def test_simulated_relays_check_the_regional_breakdown_point(tmp_path: Path) -> None:
    text = problems(
        tmp_path,
        "{clients_per_round: 2, min_clients: 2}",
        "simulation: {relay: {min_clients: 2, robust: {name: trimmed_mean, byzantine: 1}}}\n",
    )
    assert "simulation.relay.min_clients is 2" in text


def test_wall_clock_relays_get_the_regional_rule(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "{clients_per_round: 2, min_clients: 2}",
        "simulation: {relay: {min_clients: 3, robust: {name: median, byzantine: 1}}}\n",
    )
    command = relay_command(config, 9000, "eu", 9001, 4)
    overrides = [command[i + 1] for i, word in enumerate(command) if word == "--set"]
    relay = load_relay_config(flags=RELAY_FLAGS, overrides=overrides)
    assert relay.relay.min_clients == 3
    assert relay.relay.robust == config.simulation.relay.robust
