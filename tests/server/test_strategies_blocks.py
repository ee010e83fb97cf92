"""Piecewise (blocked) arithmetic gives the same results as whole-tensor arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from geofl.server.strategies import STRATEGIES, _numeric, make_strategy

PARAMS = {"fedprox": {"proximal_mu": 0.1}}


def _run(name: str, rng_seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(rng_seed)
    weights = {"w": rng.normal(size=(37, 11)).astype(np.float32), "c": np.arange(5)}
    strategy = make_strategy(name, **PARAMS.get(name, {}))
    for round_number in (1, 2):
        accumulator = strategy.begin_round(weights)
        for client in range(3):
            update = {"w": rng.normal(size=(37, 11)).astype(np.float32), "c": np.full(5, client)}
            accumulator.add(update, float(client + 1))
        weights = strategy.apply(weights, accumulator.mean(), round_number)
    return weights, strategy.state()


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_blocked_arithmetic_matches_whole_tensors(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole_weights, whole_state = _run(name, 7)
    monkeypatch.setattr(_numeric, "BLOCK", 5)  # 407 elements -> 82 blocks
    blocked_weights, blocked_state = _run(name, 7)
    for key in whole_weights:
        np.testing.assert_array_equal(blocked_weights[key], whole_weights[key])
    assert whole_state.keys() == blocked_state.keys()
    for key in whole_state:
        np.testing.assert_array_equal(blocked_state[key], whole_state[key])
