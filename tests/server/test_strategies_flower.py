"""Our strategies match Flower 1.42's on the same client results, round after round.

Flower aggregates full client weights; our clients send deltas against the global model.
Flower's server step is run by stubbing its FedAvg aggregation to return Flower's own
``aggregate_arrayrecords`` of the clients' weights, so everything after that is Flower code.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

from geofl.server.strategies import make_strategy

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    flwr_app = pytest.importorskip("flwr.app")
    flwr_strategy = pytest.importorskip("flwr.serverapp.strategy")
    flwr_utils = pytest.importorskip("flwr.serverapp.strategy.strategy_utils")

SHAPES = {"w": (3, 4), "b": (4,)}
PAIRS = [  # (our name, our params, Flower class, Flower params)
    ("fedavg", {}, None, {}),
    ("fedavgm", {"server_lr": 0.7, "server_momentum": 0.9}, "FedAvgM",
     {"server_learning_rate": 0.7, "server_momentum": 0.9}),
    ("fedadam", {"server_lr": 0.05, "tau": 1e-2}, "FedAdam", {"eta": 0.05, "tau": 1e-2}),
    ("fedyogi", {"beta_1": 0.5}, "FedYogi", {"beta_1": 0.5}),
    ("fedadagrad", {"server_lr": 0.2}, "FedAdagrad", {"eta": 0.2}),
]  # fmt: skip


def _flower_round(
    strategy: Any, weights: dict[str, Any], clients: list[Any], rnd: int, stub: dict[str, Any]
) -> Any:
    records = [
        flwr_app.RecordDict(
            {
                "arrays": flwr_app.ArrayRecord(
                    {k: flwr_app.Array(weights[k] + delta[k]) for k in SHAPES}
                ),
                "metrics": flwr_app.MetricRecord({"num-examples": n}),
            }
        )
        for delta, n in clients
    ]
    average = stub["result"] = flwr_utils.aggregate_arrayrecords(records, "num-examples")
    if strategy is None:
        return {k: a.numpy() for k, a in average.items()}
    if isinstance(strategy, flwr_strategy.FedAvgM):
        strategy.current_arrays = flwr_app.ArrayRecord(
            {k: flwr_app.Array(v) for k, v in weights.items()}
        )
    else:
        strategy.current_arrays = {k: v.copy() for k, v in weights.items()}
    arrays, _ = strategy.aggregate_train(rnd, [])
    return {k: a.numpy() for k, a in arrays.items()}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("pair", PAIRS, ids=[pair[0] for pair in PAIRS])
def test_matches_flower_over_three_rounds(pair: Any, seed: int, monkeypatch: Any) -> None:
    name, params, flower_name, flower_params = pair
    stub: dict[str, Any] = {"result": None}
    monkeypatch.setattr(flwr_strategy.FedAvg, "aggregate_train", lambda *_: (stub["result"], None))
    flower = getattr(flwr_strategy, flower_name)(**flower_params) if flower_name else None
    ours = make_strategy(name, **params)
    rng = np.random.default_rng(seed)
    start: dict[str, Any] = {k: rng.normal(size=s) for k, s in SHAPES.items()}
    mine, theirs = dict(start), dict(start)
    for rnd in (1, 2, 3):
        clients = [
            (
                {k: rng.normal(scale=0.1, size=s) for k, s in SHAPES.items()},
                int(rng.integers(1, 50)),
            )
            for _ in range(4)
        ]
        acc = ours.begin_round(mine)
        for delta, n in clients:
            acc.add(delta, n)
        mine = ours.apply(mine, acc.mean(), rnd)
        theirs = _flower_round(flower, theirs, clients, rnd, stub)
        for k in SHAPES:
            np.testing.assert_allclose(
                np.asarray(mine[k], np.float64), theirs[k], rtol=1e-9, atol=1e-11
            )
    assert any(not np.allclose(mine[k], start[k]) for k in SHAPES)
