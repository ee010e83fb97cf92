"""The server's AdamW equals ``torch.optim.AdamW`` stepping the negated mean delta."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geofl.protocols.types import Weights
from geofl.server.strategies.adamw import AdamW


def test_matches_torch_adamw_on_the_averaged_gradient() -> None:
    rng = np.random.default_rng(0)
    start = rng.normal(size=(5, 3))
    param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = torch.optim.AdamW([param], lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    strategy = AdamW(server_lr=0.01, beta_1=0.8, beta_2=0.95, eps=1e-6, weight_decay=0.1)
    weights: Weights = {"w": start.copy(), "count": np.array([3], dtype=np.int64)}
    for server_round in (1, 2, 3, 4):
        gradients = rng.normal(size=(3, 5, 3))
        mean_delta = {"w": -gradients.mean(axis=0), "count": np.array([1], dtype=np.int64)}
        weights = strategy.apply(weights, mean_delta, server_round)
        param.grad = torch.tensor(gradients.mean(axis=0))
        optimizer.step()
    np.testing.assert_allclose(weights["w"], param.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert int(weights["count"][0]) == 7  # integer tensors take w + round(delta), no decay
    assert set(strategy.state()) == {"m/w", "v/w"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"server_lr": 0.0}, "server_lr"),
        ({"beta_2": 1.0}, "beta_2"),
        ({"weight_decay": -1}, "weight"),
    ],
)
def test_bad_hyperparameters_are_named(params: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamW(**params)
