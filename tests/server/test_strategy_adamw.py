"""The server's AdamW equals ``torch.optim.AdamW`` stepping the negated mean delta."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from geofl.protocols.lr_schedule import scheduled_lr
from geofl.protocols.types import Weights
from geofl.server.strategies.adamw import AdamW


@pytest.mark.parametrize(
    "schedule",
    [
        {},
        {"warmup_steps": 2, "decay_steps": 5, "final_lr_ratio": 0.2},
    ],
    ids=["constant", "warmup-cosine"],
)
def test_matches_torch_adamw_on_the_averaged_gradient(schedule: dict[str, Any]) -> None:
    """Also with a schedule: torch's AdamW under a ``LambdaLR`` stepped after every step."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(5, 3))
    param = torch.nn.Parameter(torch.tensor(start, dtype=torch.float64))
    optimizer = torch.optim.AdamW([param], lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    strategy = AdamW(
        server_lr=0.01, beta_1=0.8, beta_2=0.95, eps=1e-6, weight_decay=0.1, **schedule
    )
    settings = (
        int(schedule.get("warmup_steps", 0)),
        int(schedule.get("decay_steps", 0)),
        schedule.get("final_lr_ratio", 0.1),
    )
    lambdas = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: scheduled_lr(1.0, done + 1, *settings)
    )
    weights: Weights = {"w": start.copy(), "count": np.array([3], dtype=np.int64)}
    for server_round in range(1, 8):
        gradients = rng.normal(size=(3, 5, 3))
        mean_delta = {"w": -gradients.mean(axis=0), "count": np.array([1], dtype=np.int64)}
        weights = strategy.apply(weights, mean_delta, server_round)
        param.grad = torch.tensor(gradients.mean(axis=0))
        optimizer.step()
        lambdas.step()
    np.testing.assert_allclose(weights["w"], param.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert int(weights["count"][0]) == 10  # integer tensors take w + round(delta), no decay
    assert set(strategy.state()) == {"m/w", "v/w"}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"server_lr": 0.0}, "server_lr"),
        ({"beta_2": 1.0}, "beta_2"),
        ({"weight_decay": -1}, "weight"),
        ({"warmup_steps": 10, "decay_steps": 10}, "decay steps"),
        ({"final_lr_ratio": 1.5}, "final_ratio"),
    ],
)
def test_bad_hyperparameters_are_named(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamW(**params)
