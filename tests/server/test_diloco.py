"""DiLoCo's outer step equals PyTorch's Nesterov SGD on the pseudo-gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.config import ConfigError, parse_config
from geofl.server.coordinator import build_strategy
from geofl.server.rounds.records import round_config
from geofl.server.strategies import make_strategy
from geofl.server.strategies.diloco import DiLoCo


@settings(max_examples=25, deadline=None)
@given(
    lr=st.floats(0.05, 1.5),
    momentum=st.floats(0.01, 0.95),
    seed=st.integers(0, 2**31 - 1),
)
def test_outer_steps_match_torch_nesterov_sgd(lr: float, momentum: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    weights = {"w": rng.standard_normal(7).astype(np.float64)}
    reference = torch.tensor(weights["w"].copy(), requires_grad=True)
    optimizer = torch.optim.SGD([reference], lr=lr, momentum=momentum, nesterov=True)
    strategy = DiLoCo(outer_lr=lr, outer_momentum=momentum)
    for server_round in (1, 2, 3):
        delta = rng.standard_normal(7)
        weights = strategy.apply(weights, {"w": delta}, server_round)
        optimizer.zero_grad()
        reference.grad = torch.tensor(-delta)  # pseudo-gradient: global - average
        optimizer.step()
        assert np.allclose(weights["w"], reference.detach().numpy(), atol=1e-9)


def test_without_momentum_and_unit_rate_it_is_fedavg() -> None:
    fedavg = make_strategy("fedavg")
    diloco = DiLoCo(outer_lr=1.0, outer_momentum=0.0)
    weights = {"w": np.arange(4.0)}
    delta = {"w": np.full(4, 0.5)}
    assert np.array_equal(
        diloco.apply(weights, delta, 1)["w"], fedavg.apply(weights, delta, 1)["w"]
    )


def test_momentum_survives_a_checkpoint() -> None:
    first = DiLoCo(0.7, 0.9)
    first.apply({"w": np.zeros(3)}, {"w": np.ones(3)}, 1)
    second = DiLoCo(0.7, 0.9)
    second.load_state(first.state())
    step = {"w": np.full(3, 2.0)}
    assert np.array_equal(
        first.apply({"w": np.zeros(3)}, step, 2)["w"],
        second.apply({"w": np.zeros(3)}, step, 2)["w"],
    )


BASE = {"run": {"name": "d", "rounds": 2}, "model": "m:f"}


def test_mode_diloco_builds_the_outer_optimizer_and_sets_local_steps() -> None:
    config = parse_config(
        {**BASE, "schedule": {"mode": "diloco", "diloco": {"local_steps": 30, "outer_lr": 0.5}}},
        source="t",
    )
    strategy = build_strategy(config)
    assert isinstance(strategy, DiLoCo) and strategy.server_lr == 0.5
    assert round_config(config)["local_steps"] == 30
    # A local_steps the user wrote wins.
    mine = parse_config(
        {**BASE, "schedule": {"mode": "diloco"}, "round_config": {"local_steps": 3}}, source="t"
    )
    assert round_config(mine)["local_steps"] == 3


def test_mode_diloco_with_another_strategy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"schedule\.mode diloco uses its own outer optimizer"):
        parse_config({**BASE, "schedule": {"mode": "diloco"}, "strategy": {"name": "fedadam"}}, "t")


def test_partial_sync_is_checked_against_the_local_steps_rounds_really_have() -> None:
    """round_config's local_steps wins over schedule.diloco's, so it is what must fit."""
    schedule = {
        "mode": "diloco",
        "diloco": {"local_steps": 30},
        "partial_sync": {"sync_points": 4},
    }
    with pytest.raises(ConfigError, match=r"4 sync points but rounds have 2 local steps"):
        parse_config({**BASE, "schedule": schedule, "round_config": {"local_steps": 2}}, "t")
    config = parse_config({**BASE, "schedule": schedule, "round_config": {"local_steps": 8}}, "t")
    strategy = build_strategy(config)
    assert isinstance(strategy, DiLoCo) and strategy.layer_sync is not None
    # The automatic tail follows the 8 steps clients will run: 8 // (2 x 4) = 1.
    assert strategy.layer_sync.tail_steps == 1
