"""Server steps: closed-form values, state round trips, dtypes, and untouched arguments."""

from __future__ import annotations

import copy
import math
from typing import Any

import hypothesis.extra.numpy as hnp
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.types import Scalar
from geofl.server.strategies import (
    FedAdagrad,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    ServerOptStrategy,
    StrategyError,
)

Array = npt.NDArray[Any]
SETTINGS = settings(max_examples=30, deadline=None)
finite = st.floats(-10, 10, allow_subnormal=False)
vectors = hnp.arrays(np.float64, st.integers(0, 5), elements=finite)
rates = st.floats(1e-3, 2.0)
decays = st.floats(0.0, 0.999)
taus = st.floats(1e-6, 1.0)


def _step(strategy: ServerOptStrategy, w: Array, d: Array, server_round: int = 1) -> Array:
    return strategy.apply({"x": w}, {"x": d}, server_round)["x"]


@SETTINGS
@given(vectors, rates)
def test_fedavg_one_step(d: Array, lr: float) -> None:
    w = np.linspace(-1, 1, d.size)
    np.testing.assert_allclose(_step(FedAvg(server_lr=lr), w, d), w + lr * d, rtol=1e-12)


@SETTINGS
@given(vectors, vectors, rates, decays)
def test_fedavgm_two_steps(d1: Array, d2: Array, lr: float, beta: float) -> None:
    d2 = np.resize(d2, d1.shape)
    strategy = FedAvgM(server_lr=lr, server_momentum=beta)
    w0 = np.zeros_like(d1)
    w1 = _step(strategy, w0, d1)
    w2 = _step(strategy, w1, d2, 2)
    np.testing.assert_allclose(w1, lr * d1, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(w2, w1 + lr * (beta * d1 + d2), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(vectors, rates, decays, decays, taus, st.integers(1, 50))
def test_adaptive_one_step_closed_form(
    d: Array, lr: float, b1: float, b2: float, tau: float, server_round: int
) -> None:
    w = np.ones_like(d)
    m = (1 - b1) * d
    adam_lr = lr * math.sqrt(1 - b2 ** (server_round + 1)) / (1 - b1 ** (server_round + 1))
    v_ema = (1 - b2) * d**2
    expected = {
        FedAdam(lr, b1, b2, tau): w + adam_lr * m / (np.sqrt(v_ema) + tau),
        FedYogi(lr, b1, b2, tau): w + lr * m / (np.sqrt(v_ema) + tau),  # sign(0 - d**2) = -1
        FedAdagrad(lr, b1, tau): w + lr * m / (np.abs(d) + tau),
    }
    for strategy, value in expected.items():
        np.testing.assert_allclose(_step(strategy, w, d, server_round), value, rtol=1e-12)


def test_fedadagrad_hand_computed_two_rounds() -> None:
    strategy = FedAdagrad(server_lr=0.1, tau=1.0)
    w1 = _step(strategy, np.array([0.0]), np.array([3.0]))  # 0.1 * 3 / (3 + 1)
    np.testing.assert_allclose(w1, [0.075], rtol=1e-15)
    w2 = _step(strategy, w1, np.array([4.0]), 2)  # v = 9 + 16 -> 0.1 * 4 / (5 + 1)
    np.testing.assert_allclose(w2, np.array([0.075 + 0.4 / 6]), rtol=1e-15)
    np.testing.assert_array_equal(strategy.state()["v/x"], [25.0])


def test_fedyogi_second_round_uses_sign_rule() -> None:
    strategy = FedYogi(server_lr=1.0, beta_1=0.0, beta_2=0.5, tau=1.0)
    _step(strategy, np.zeros(2), np.array([2.0, 2.0]))  # v = 0.5 * 4 = 2
    _step(strategy, np.zeros(2), np.array([1.0, 3.0]), 2)
    # v - 0.5 * d2 * sign(v - d2): [2 - 0.5 * 1 * 1, 2 - 0.5 * 9 * -1]
    v = np.asarray(strategy.state()["v/x"], dtype=np.float64)
    np.testing.assert_allclose(v, np.array([1.5, 6.5]), rtol=1e-15)


def _make_all() -> list[ServerOptStrategy]:
    return [
        FedAvg(0.5),
        FedProx(0.1, 0.7),
        FedAvgM(0.8, 0.6),
        FedAdam(0.05, 0.8, 0.9, 0.01),
        FedYogi(0.05, 0.8, 0.9, 0.01),
        FedAdagrad(0.05, 0.3, 0.01),
    ]


MODEL: dict[str, Array] = {
    "w": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array(0.5, np.float64),
    "steps": np.array(10, np.int64),
}


def _delta(seed: int) -> dict[str, Array]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.normal(size=(2, 3)).astype(np.float32),
        "b": np.array(rng.normal()),
        "steps": np.array(2, np.int64),
    }


@pytest.mark.parametrize("index", range(6))
def test_state_round_trip_gives_identical_next_steps(index: int) -> None:
    original = _make_all()[index]
    weights = MODEL
    for server_round in (1, 2):
        weights = original.apply(weights, _delta(server_round), server_round)
    restored = _make_all()[index]
    restored.load_state(original.state())
    for server_round in (3, 4):
        a = original.apply(weights, _delta(server_round), server_round)
        b = restored.apply(weights, _delta(server_round), server_round)
        for name in MODEL:
            np.testing.assert_array_equal(a[name], b[name])
        weights = a
    assert set(original.state()) == {f"{slot}/{n}" for slot in original.slots for n in ("w", "b")}


@pytest.mark.parametrize("index", range(6))
def test_arguments_are_never_mutated(index: int) -> None:
    strategy = _make_all()[index]
    delta, config = _delta(1), {"lr": 0.1, "epochs": 2}
    saved = copy.deepcopy((MODEL, delta, config))
    new = strategy.apply(MODEL, delta, 1)
    fit = strategy.configure_fit(1, config)
    evaluate = strategy.configure_evaluate(1, config)
    assert fit is not config and evaluate is not config
    assert config == saved[2]
    for before, after in ((saved[0], MODEL), (saved[1], delta)):
        for name in before:
            assert after[name].dtype == before[name].dtype
            np.testing.assert_array_equal(after[name], before[name])
    assert all(new[name] is not MODEL[name] for name in MODEL)
    assert {name: new[name].dtype for name in new} == {n: v.dtype for n, v in MODEL.items()}
    assert new["steps"] == 12  # integer tensors: w + delta, no learning rate, no state


def test_state_is_a_copy() -> None:
    strategy = FedAvgM(1.0, 0.5)
    strategy.apply(MODEL, _delta(1), 1)
    state = strategy.state()
    state["momentum/w"][:] = 1e9
    assert float(np.abs(strategy.state()["momentum/w"]).max()) < 1e3


def test_fedprox_adds_mu_to_fit_config_only() -> None:
    strategy = FedProx(proximal_mu=0.25)
    assert strategy.configure_fit(3, {"epochs": 1}) == {"epochs": 1, "proximal_mu": 0.25}
    assert strategy.configure_evaluate(3, {"epochs": 1}) == {"epochs": 1}


def test_integer_tensors_round_and_clip() -> None:
    strategy = FedAdam()
    model: dict[str, Array] = {"u": np.array([250, 5], np.uint8), "i": np.array([7], np.int32)}
    delta = {"u": np.array([10, -2], np.int8), "i": np.array([2.6])}
    new = strategy.apply(model, delta, 1)
    np.testing.assert_array_equal(new["u"], np.array([255, 3], np.uint8))
    np.testing.assert_array_equal(new["i"], np.array([10], np.int32))
    assert strategy.state() == {}


def test_failed_apply_changes_no_state() -> None:
    strategy = FedAvgM(1.0, 0.5)
    strategy.apply(MODEL, _delta(1), 1)
    before = strategy.state()
    model: dict[str, Array] = {"a": np.zeros(1), "h": np.array([6e4], np.float16)}
    with pytest.raises(StrategyError, match="optimizer state covers"):
        strategy.apply(model, {"a": np.ones(1), "h": np.ones(1)}, 2)
    fresh = FedAvgM(1.0, 0.5)
    with pytest.raises(StrategyError, match=r"'h'.*overflows float16"):
        fresh.apply(model, {"a": np.ones(1), "h": np.array([6e4])}, 1)
    assert fresh.state() == {}
    after = strategy.state()
    assert after.keys() == before.keys()
    assert all(np.array_equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize(
    ("delta", "server_round", "message"),
    [
        ({"w": np.zeros((2, 3))}, 1, r"missing \['b', 'steps'\]"),
        ({**_delta(0), "w": np.zeros((3, 2))}, 1, r"'w' has shape \(3, 2\)"),
        (_delta(0), 0, "server_round"),
    ],
)
def test_apply_rejects_mismatched_input(delta: Any, server_round: int, message: str) -> None:
    with pytest.raises(StrategyError, match=message):
        FedAdam().apply(MODEL, delta, server_round)


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"x/w": np.zeros(2)}, "unexpected state key 'x/w'"),
        ({"mw": np.zeros(2)}, "unexpected state key 'mw'"),
        ({"m/w": np.zeros(2)}, r"lacks slots \['v'\]"),
        ({"m/w": np.zeros(2), "v/w": np.zeros(3)}, "differ in shape"),
        ({"m/w": np.zeros(2, np.int64), "v/w": np.zeros(2)}, "float dtype"),
        ({"m/w": np.array([np.nan, 0.0]), "v/w": np.zeros(2)}, "finite"),
    ],
)
def test_load_state_rejects_malformed_state(state: Any, message: str) -> None:
    strategy = FedYogi()
    strategy.apply(MODEL, _delta(1), 1)
    before = strategy.state()
    with pytest.raises(StrategyError, match=message):
        strategy.load_state(state)
    assert strategy.state().keys() == before.keys()


def test_loaded_state_for_another_model_fails_at_begin_round() -> None:
    strategy = FedAvgM()
    strategy.load_state({"momentum/other": np.zeros(3)})
    with pytest.raises(StrategyError, match="optimizer state covers"):
        strategy.begin_round(MODEL)
    strategy.load_state({"momentum/w": np.zeros((3, 2)), "momentum/b": np.zeros(())})
    with pytest.raises(StrategyError, match=r"'w' has shape \(3, 2\)"):
        strategy.begin_round(MODEL)
    strategy.load_state({})
    assert strategy.begin_round(MODEL).names == ("w", "b", "steps")


def test_stateless_strategies_refuse_state() -> None:
    assert FedAvg().state() == {}
    with pytest.raises(StrategyError, match="unexpected state key"):
        FedProx(0.1).load_state({"momentum/w": np.zeros(1)})


@pytest.mark.parametrize(
    "build",
    [
        lambda: FedAvg(server_lr=0.0),
        lambda: FedAvg(server_lr=float("nan")),
        lambda: FedAvgM(server_momentum=1.0),
        lambda: FedProx(proximal_mu=-0.1),
        lambda: FedAdam(beta_1=1.0),
        lambda: FedYogi(beta_2=-0.1),
        lambda: FedAdagrad(tau=0.0),
    ],
)
def test_out_of_range_hyperparameters_raise(build: Any) -> None:
    with pytest.raises(ValueError, match="must be in"):
        build()


def test_aggregate_metrics_weighted_numeric_common_keys() -> None:
    results: list[tuple[int, dict[str, Scalar]]] = [
        (10, {"loss": 1.0, "acc": 1, "flag": True, "tag": "x", "only_here": 3.0}),
        (30, {"loss": 3.0, "acc": 0, "flag": False, "tag": "y"}),
    ]
    assert FedAvg().aggregate_metrics(results) == {"loss": 2.5, "acc": 0.25}
    assert FedAvg().aggregate_metrics([]) == {}
    assert FedAvg().aggregate_metrics([(0, {"loss": 1.0})]) == {}
    with pytest.raises(StrategyError, match="num_examples"):
        FedAvg().aggregate_metrics([(-1, {"loss": 1.0})])
