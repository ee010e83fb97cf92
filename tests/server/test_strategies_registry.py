"""Registry completeness, the factory's errors, and the package's public surface."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest

import geofl.server.strategies as strategies
from geofl.server.strategies import STRATEGIES, Strategy, make_strategy

#: Parameters a strategy cannot be built without; every other name builds from defaults.
REQUIRED: dict[str, dict[str, Any]] = {"fedprox": {"proximal_mu": 0.01}}


def test_registry_names() -> None:
    assert set(STRATEGIES) == {
        "fedavg",
        "fedavgm",
        "fedprox",
        "fedadam",
        "fedyogi",
        "fedadagrad",
        "adamw",
    }
    assert all(cls.name == name for name, cls in STRATEGIES.items())


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_registered_name_builds_and_runs_a_round(name: str) -> None:
    strategy = make_strategy(name, **REQUIRED.get(name, {}))
    assert isinstance(strategy, STRATEGIES[name])
    model: dict[str, Any] = {"w": np.zeros(3, np.float32)}
    acc = strategy.begin_round(model)
    acc.add({"w": np.ones(3, np.float32)}, 2)
    new = strategy.apply(model, acc.mean(), 1)
    assert new["w"].dtype == np.float32
    assert bool(np.all(np.asarray(new["w"], np.float32) > 0))


def test_make_strategy_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"unknown strategy 'fedsgd'; known strategies: \["):
        make_strategy("fedsgd")
    with pytest.raises(ValueError, match=r"strategy 'fedavg':.*momentum"):
        make_strategy("fedavg", momentum=0.9)
    with pytest.raises(ValueError, match=r"strategy 'fedprox':.*proximal_mu"):
        make_strategy("fedprox")
    with pytest.raises(ValueError, match="strategy 'fedadam': tau must be in"):
        make_strategy("fedadam", tau=-1.0)


def test_public_surface_is_complete() -> None:
    public = {
        name
        for name, value in vars(strategies).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    }
    assert set(strategies.__all__) == public
    for cls in STRATEGIES.values():
        assert cls.__name__ in strategies.__all__
        assert issubclass(cls, Strategy)
