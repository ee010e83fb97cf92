"""Flower 1.42 strategies behind geofl's Strategy interface.

The reference is Flower itself: the same strategy class, configured and fed the same client
replies (global + delta, as a Flower ClientApp would send them) by hand. The adapter must
produce the same new model, cast to the model's dtypes, and the same optimizer state.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from geofl.protocols.streams import Incoming
from geofl.protocols.tensors import TensorSpec
from geofl.server.config import ConfigError, load_config, parse_config
from geofl.server.models.spool import MemoryBudget, SpooledUpdate, SpoolSink
from geofl.server.strategies import (
    FLOWER_STRATEGIES,
    FlowerConfigError,
    FlowerStrategy,
    StrategyError,
    UpdateRejected,
    make_strategy,
)

with warnings.catch_warnings():  # flwr's import chain trips deprecation warnings (click)
    warnings.simplefilter("ignore", DeprecationWarning)
    flwr_app = pytest.importorskip("flwr.app")
    flwr_strategy = pytest.importorskip("flwr.serverapp.strategy")

DP = {"noise_multiplier": 0.5, "num_sampled_clients": 7}
#: (Flower class, args, wraps) for every supported strategy; 7 clients suit them all.
EVERY: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("FedAvg", {}, None),
    ("FedAvgM", {"server_learning_rate": 0.7, "server_momentum": 0.9}, None),
    ("FedProx", {"proximal_mu": 0.1}, None),
    ("FedAdagrad", {"eta": 0.2}, None),
    ("FedAdam", {"eta": 0.05, "tau": 1e-2}, None),
    ("FedYogi", {"beta_1": 0.5}, None),
    ("FedMedian", {}, None),
    ("FedTrimmedAvg", {"beta": 0.2}, None),
    ("Krum", {"num_malicious_nodes": 1}, None),
    ("MultiKrum", {"num_malicious_nodes": 1, "num_nodes_to_select": 3}, None),
    ("Bulyan", {"num_malicious_nodes": 1}, None),
    ("QFedAvg", {"client_learning_rate": 0.1, "q": 0.2}, None),
    ("DifferentialPrivacyServerSideFixedClipping", {**DP, "clipping_norm": 1.0}, None),
    ("DifferentialPrivacyClientSideFixedClipping", {**DP, "clipping_norm": 1.0}, None),
    ("DifferentialPrivacyServerSideAdaptiveClipping", DP, {"flower": "FedAdam"}),
    ("DifferentialPrivacyClientSideAdaptiveClipping", DP, {"flower": "FedAvg"}),
]
for _index, (_name, _args, _wraps) in enumerate(EVERY):
    if _name.startswith("DifferentialPrivacy") and _wraps is None:
        EVERY[_index] = (_name, _args, {"flower": "FedAvg"})


class _Grid:
    """Just enough of a Flower Grid for configure_train's sampling."""

    def get_node_ids(self) -> list[int]:
        return [2, 3]


@pytest.fixture(autouse=True)
def _flower_process_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's Message constructor wants a Flower process identity (the adapter sets one)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute in ("_run_id", "_node_id", "_task_id"):
        if getattr(TaskIdentity, attribute) is None:
            monkeypatch.setattr(TaskIdentity, attribute, 1)


def _reply(arrays: dict[str, np.ndarray], metrics: dict[str, Any]) -> Any:
    """A client's train reply, built as Flower's runtime would deliver it."""
    metadata = flwr_app.Metadata(
        run_id=1,
        message_id=uuid.uuid4().hex,
        src_node_id=2,
        dst_node_id=1,
        reply_to_message_id=uuid.uuid4().hex,
        group_id="",
        created_at=time.time(),
        ttl=600.0,
        message_type="train",
    )
    content = flwr_app.RecordDict(
        {
            "arrays": flwr_app.ArrayRecord({k: flwr_app.Array(v) for k, v in arrays.items()}),
            "metrics": flwr_app.MetricRecord(metrics),
        }
    )
    return flwr_app.Message(content=content, metadata=metadata)


def _client_arrays(weights: dict[str, np.ndarray], delta: dict[str, np.ndarray]) -> dict[str, Any]:
    """What the client holds: global + delta in the model's dtype (integers: rounded delta)."""
    out = {}
    for k, w in weights.items():
        step = np.rint(delta[k]) if w.dtype.kind in "iu" else delta[k]
        out[k] = np.asarray(w.astype(np.float64) + step).astype(w.dtype)
    return out


def _flower_round(
    reference: Any, weights: dict[str, np.ndarray], clients: list[Any], rnd: int
) -> dict[str, np.ndarray]:
    arrays = flwr_app.ArrayRecord({k: flwr_app.Array(v) for k, v in weights.items()})
    list(reference.configure_train(rnd, arrays, flwr_app.ConfigRecord(), _Grid()))
    replies = [
        _reply(_client_arrays(weights, delta), {"num-examples": n, **metrics})
        for delta, n, metrics in clients
    ]
    np.random.seed(rnd)  # the DP wrappers draw their noise from NumPy's global generator
    result, _ = reference.aggregate_train(rnd, replies)
    return {
        k: np.asarray(np.rint(v) if w.dtype.kind in "iu" else v).astype(w.dtype)
        for (k, w), v in zip(weights.items(), (result[k].numpy() for k in weights), strict=True)
    }


def _our_round(
    ours: FlowerStrategy, weights: dict[str, np.ndarray], clients: list[Any], rnd: int
) -> dict[str, np.ndarray]:
    accumulator = ours.begin_round(weights)
    ours.configure_fit(rnd, {})
    for delta, n, _ in clients:
        accumulator.add(delta, n)
    ours.aggregate_metrics([(n, metrics) for _, n, metrics in clients])
    np.random.seed(rnd)
    return ours.apply(weights, accumulator.mean(), rnd)


def _clients(
    rng: np.random.Generator, weights: dict[str, np.ndarray], count: int
) -> list[tuple[dict[str, np.ndarray], int, dict[str, Any]]]:
    clients = []
    for index in range(count):
        delta = {
            k: rng.integers(-2, 3, size=w.shape).astype(w.dtype)
            if w.dtype.kind in "iu"
            else rng.normal(scale=0.3, size=w.shape).astype(w.dtype)
            for k, w in weights.items()
        }
        metrics = {"train_loss": float(rng.uniform(0.1, 2.0)), "norm_bit": index % 2}
        clients.append((delta, int(rng.integers(1, 50)), metrics))
    return clients


def _new(name: str, args: dict[str, Any], wraps: dict[str, Any] | None) -> FlowerStrategy:
    return FlowerStrategy(name, args, wraps)


def _reference(name: str, args: dict[str, Any], wraps: dict[str, Any] | None) -> Any:
    if wraps is None:
        return getattr(flwr_strategy, name)(**args)
    inner = getattr(flwr_strategy, wraps["flower"])(**wraps.get("args", {}))
    return getattr(flwr_strategy, name)(inner, **args)


def _assert_same(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
    assert list(ours) == list(theirs)
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype, k
        np.testing.assert_array_equal(ours[k], theirs[k], err_msg=k)


# ----------------------------------------------------------------- same model as Flower


@pytest.mark.parametrize("name", ["FedAvg", "FedAdam", "FedMedian"])
def test_model_and_state_equal_flower_on_the_same_replies(name: str) -> None:
    """float32 and int64 tensors, 3 rounds: the same model and FedAdam moments as Flower's."""
    args = {"eta": 0.05, "tau": 1e-2} if name == "FedAdam" else {}
    ours, reference = _new(name, args, None), _reference(name, args, None)
    rng = np.random.default_rng(3)
    start = {
        "w": rng.normal(size=(5, 3)).astype(np.float32),
        "b": rng.normal(size=3).astype(np.float32),
        "steps": np.array(4, np.int64),
    }
    weights = start
    for rnd in (1, 2, 3):
        clients = _clients(rng, weights, 5)
        theirs = _flower_round(reference, weights, clients, rnd)
        mine = _our_round(ours, weights, clients, rnd)
        _assert_same(mine, theirs)
        weights = mine
        if name == "FedAdam":
            state = ours.state()
            for slot in ("m_t", "v_t"):
                for k, value in getattr(reference, slot).items():
                    np.testing.assert_array_equal(state[f"{slot}/{k}"], value)
    assert not np.allclose(weights["w"], start["w"])


def test_fedmedian_is_the_elementwise_median_of_the_clients() -> None:
    """Independent of Flower's code: the median of (global + delta) over five clients."""
    ours = _new("FedMedian", {}, None)
    weights = {"w": np.zeros(4, np.float64)}
    deltas = [np.array([1.0, -5.0, 2.0, 0.5]) * k for k in (1, 2, -3, 4, 0.5)]
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    for k, delta in enumerate(deltas):
        accumulator.add({"w": delta}, 10 * (k + 1))  # weights do not move a median
    new = ours.apply(weights, accumulator.mean(), 1)
    np.testing.assert_array_equal(new["w"], np.median(np.stack(deltas), axis=0))


@pytest.mark.parametrize(("name", "args", "wraps"), EVERY, ids=[entry[0] for entry in EVERY])
def test_every_supported_strategy_equals_flower(
    name: str, args: dict[str, Any], wraps: dict[str, Any] | None
) -> None:
    ours, reference = _new(name, args, wraps), _reference(name, args, wraps)
    rng = np.random.default_rng(11)
    weights = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=3)}
    for rnd in (1, 2):
        clients = _clients(rng, weights, 7)
        theirs = _flower_round(reference, weights, clients, rnd)
        mine = _our_round(ours, weights, clients, rnd)
        _assert_same(mine, theirs)
        weights = mine


def test_supported_names_cover_the_table() -> None:
    assert sorted(FLOWER_STRATEGIES) == sorted(name for name, _, _ in EVERY)


# ----------------------------------------------------------------- configuration of rounds


def test_configure_fit_sends_flowers_config_without_touching_the_base() -> None:
    ours = _new("FedProx", {"proximal_mu": 0.3}, None)
    base = {"lr": 0.05}
    ours.begin_round({"w": np.zeros(2, np.float32)})
    assert ours.configure_fit(4, base) == {"lr": 0.05, "proximal-mu": 0.3, "server-round": 4}
    assert base == {"lr": 0.05}
    assert ours.configure_evaluate(4, {"batch": 8}) == {"batch": 8, "server-round": 4}
    dp = _new(
        "DifferentialPrivacyClientSideFixedClipping",
        {**DP, "clipping_norm": 2.5},
        {"flower": "FedAvg"},
    )
    dp.begin_round({"w": np.zeros(2, np.float32)})
    assert dp.configure_fit(1, {})["clipping_norm"] == 2.5


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_flowers_sampling_of_the_stand_in_grid_is_not_logged() -> None:
    """Flower samples a stand-in grid sized to its minimum: "Sampled 2 nodes (out of 2)"
    would be logged whatever cohort geofl's scheduler picked."""
    flower_logger = logging.getLogger("flwr")
    lines = _Lines()
    flower_logger.addHandler(lines)
    try:
        ours = _new("FedAvg", {}, None)
        ours.begin_round({"w": np.zeros(2, np.float32)})
        ours.configure_fit(1, {})
        ours.configure_evaluate(1, {})
        flower_logger.info("configure_train: Sampled %s nodes (out of %s)", 3, 3)
    finally:
        flower_logger.removeHandler(lines)
    # Only the line logged outside configure passes: the filter is gone afterwards.
    assert [line for line in lines.lines if "Sampled" in line] == [
        "configure_train: Sampled 3 nodes (out of 3)"
    ]
    assert flower_logger.propagate is False  # its own handler prints it: once, not twice


def test_configure_fit_needs_a_begun_round() -> None:
    with pytest.raises(StrategyError, match="begin_round"):
        _new("FedAvg", {}, None).configure_fit(1, {})


def test_flowers_grid_cannot_send() -> None:
    from geofl.server.strategies._flower_bridge import CohortGrid

    grid = CohortGrid(3)
    assert list(grid.get_node_ids()) == [2, 3, 4]
    with pytest.raises(StrategyError, match="round engine"):
        grid.send_and_receive([])


# ----------------------------------------------------------------- updates and metrics


def _spooled(update: dict[str, np.ndarray], budget: int) -> SpooledUpdate:
    sink = SpoolSink(MemoryBudget(budget), sum(a.nbytes for a in update.values()))
    for name, array in update.items():
        spec = TensorSpec(name, str(array.dtype), array.shape)
        sink.begin(Incoming(spec, spec))
        sink.write(array.tobytes())
        sink.end()
    return sink.update()


@pytest.mark.parametrize("budget", [0, 1 << 20], ids=["spooled-to-disk", "in-memory"])
def test_updates_stay_readable_after_the_engine_closes_them(budget: int) -> None:
    """The engine closes each upload right after add(); the kept views must survive that."""
    ours = _new("FedMedian", {}, None)
    weights = {"w": np.zeros((3, 2), np.float32), "n": np.zeros(2, np.int64)}
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    for shift in (1.0, 2.0, 4.0):
        update = _spooled(
            {"w": np.full((3, 2), shift, np.float32), "n": np.ones(2, np.int64)}, budget
        )
        accumulator.add(update, 1.0)
        update.close()
    new = ours.apply(weights, accumulator.mean(), 1)
    np.testing.assert_array_equal(new["w"], np.full((3, 2), 2.0, np.float32))
    np.testing.assert_array_equal(new["n"], np.ones(2, np.int64))


@pytest.mark.parametrize(
    ("update", "weight", "match"),
    [
        ({"w": np.zeros(3, np.float16)}, 1.0, "expected shape"),
        ({"v": np.zeros(2, np.float16)}, 1.0, "missing \\['w'\\]"),
        ({"w": np.array([0.0, np.nan], np.float16)}, 1.0, "not finite"),
        ({"w": np.array([0.0, 60000.0], np.float16)}, 1.0, "overflows float16"),
        ({"w": np.array(["a", "b"])}, 1.0, "float or integer dtype"),
        ({"w": np.zeros(2, np.float16)}, 0.0, "weight must be finite and > 0"),
    ],
)
def test_bad_updates_are_rejected_and_not_kept(update: Any, weight: float, match: str) -> None:
    ours = _new("FedAvg", {}, None)
    weights = {"w": np.array([1.0, 30000.0], np.float16)}
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    with pytest.raises(UpdateRejected, match=match):
        accumulator.add(update, weight)
    assert accumulator.count == 0
    with pytest.raises(StrategyError, match="zero updates"):
        accumulator.mean()


def test_metrics_go_through_flower_and_reach_the_replies() -> None:
    ours = _new("QFedAvg", {"client_learning_rate": 0.1}, None)
    weights = {"w": np.zeros(2)}
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    accumulator.add({"w": np.ones(2)}, 1)
    accumulator.add({"w": np.full(2, 3.0)}, 3)
    metrics = ours.aggregate_metrics(
        [(1, {"train_loss": 1.0, "acc": 0.5, "tag": "x"}), (3, {"train_loss": 2.0})]
    )
    assert metrics == pytest.approx({"train_loss": 1.75})  # acc and tag: not from everyone
    new = ours.apply(weights, accumulator.mean(), 1)  # QFedAvg read both train losses
    assert new["w"].dtype == np.float64 and bool(np.all(new["w"] > 0))
    assert ours.aggregate_metrics([(0, {"a": 1.0})]) == {}


def test_client_metrics_that_never_arrive_fail_the_round_with_flowers_reason() -> None:
    ours = _new("QFedAvg", {"client_learning_rate": 0.1}, None)
    weights = {"w": np.zeros(2)}
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    accumulator.add({"w": np.ones(2)}, 1)
    with pytest.raises(StrategyError, match="train_loss"):
        accumulator.mean()


def test_bulyan_without_enough_updates_fails_the_round() -> None:
    ours = _new("Bulyan", {"num_malicious_nodes": 1}, None)
    weights = {"w": np.zeros(2)}
    accumulator = ours.begin_round(weights)
    ours.configure_fit(1, {})
    for k in range(3):
        accumulator.add({"w": np.full(2, float(k))}, 1)
    with pytest.raises(StrategyError, match="produced no model"):
        accumulator.mean()


# ----------------------------------------------------------------- state


@pytest.mark.parametrize(
    ("name", "args", "wraps", "keys"),
    [
        ("FedAdam", {"eta": 0.05}, None, {"m_t/w", "m_t/b", "v_t/w", "v_t/b"}),
        ("FedAvgM", {"server_momentum": 0.9}, None, {"momentum_vector/w", "momentum_vector/b"}),
        (
            "DifferentialPrivacyServerSideAdaptiveClipping",
            DP,
            {"flower": "FedYogi"},
            {
                "clipping_norm",
                "strategy.m_t/w",
                "strategy.m_t/b",
                "strategy.v_t/w",
                "strategy.v_t/b",
            },
        ),
    ],
)
def test_state_resumes_bit_for_bit(
    name: str, args: dict[str, Any], wraps: dict[str, Any] | None, keys: set[str]
) -> None:
    rng = np.random.default_rng(5)
    weights = {"w": rng.normal(size=(3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    rounds = [_clients(rng, weights, 7) for _ in range(3)]
    straight = _new(name, args, wraps)
    assert straight.state() == {} or set(straight.state()) == {"clipping_norm"}
    for rnd in (1, 2):
        weights = _our_round(straight, weights, rounds[rnd - 1], rnd)
    saved = straight.state()
    assert set(saved) == keys
    resumed = _new(name, args, wraps)
    resumed.load_state(saved)
    expected = _our_round(straight, weights, rounds[2], 3)
    _assert_same(_our_round(resumed, weights, rounds[2], 3), expected)
    assert straight.state().keys() == resumed.state().keys()
    for key, value in straight.state().items():
        np.testing.assert_array_equal(resumed.state()[key], value, err_msg=key)


def test_state_of_a_stateless_strategy_is_empty_and_bad_state_is_refused() -> None:
    assert _new("FedMedian", {}, None).state() == {}
    with pytest.raises(StrategyError, match="unexpected state key 'm_t/w'"):
        _new("FedAvg", {}, None).load_state({"m_t/w": np.zeros(2)})
    adam = _new("FedAdam", {}, None)
    with pytest.raises(StrategyError, match="finite"):
        adam.load_state({"m_t/w": np.array([np.nan])})
    adam.load_state({"m_t/w": np.zeros(3), "v_t/w": np.zeros(3)})
    with pytest.raises(StrategyError, match="covers tensors"):
        adam.begin_round({"v": np.zeros(3)})


def test_a_refused_aggregate_leaves_the_state_as_it_was() -> None:
    ours = _new("FedAdam", {"eta": 0.05}, None)
    rng = np.random.default_rng(9)
    weights = {"w": rng.normal(size=4)}
    weights = _our_round(ours, weights, _clients(rng, weights, 3), 1)
    before = ours.state()
    clients = _clients(rng, weights, 3)
    accumulator = ours.begin_round(weights)
    ours.configure_fit(2, {})
    for delta, n, _ in clients:
        accumulator.add(delta, n)
    aggregate = accumulator.mean()
    assert not np.array_equal(ours.state()["m_t/w"], before["m_t/w"])
    with pytest.raises(StrategyError, match="round 2, not 3"):
        ours.apply(weights, aggregate, 3)
    for key, value in before.items():
        np.testing.assert_array_equal(ours.state()[key], value)
    with pytest.raises(StrategyError, match=r"FlowerReplies\.mean"):
        ours.apply(weights, {"w": np.zeros(4)}, 2)


# ----------------------------------------------------------------- configuration


BASE = {"run": {"name": "x"}, "model": "m:f"}


def _problem(strategy: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({**BASE, "strategy": strategy})
    (line,) = str(info.value).splitlines()
    return line.removeprefix("<config>: ")


def test_a_flower_section_builds_the_adapter() -> None:
    from geofl.server.coordinator import build_strategy

    config = parse_config(
        {
            **BASE,
            "strategy": {
                "flower": "FedAdam",
                "args": {"eta": 0.01},
                "clients_per_round": 3,
                "min_clients": 3,
            },
        }
    )
    strategy = build_strategy(config)
    assert isinstance(strategy, FlowerStrategy)
    assert isinstance(strategy.flower_strategy, flwr_strategy.FedAdam)
    assert strategy.flower_strategy.eta == 0.01
    assert config.strategy.clients_per_round == 3
    assert config.to_dict()["strategy"]["flower"] == "FedAdam"


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        (
            {"flower": "FedAdm"},
            "strategy.flower: 'FedAdm' is not a supported Flower strategy; "
            "supported: FedAvg, FedAvgM,",
        ),
        (
            {"flower": "FedAdam", "args": {"etaa": 1.0}},
            "strategy.args.etaa: Flower FedAdam takes "
            "no argument 'etaa'; it takes ['arrayrecord_key', 'beta_1', 'beta_2', "
            "'configrecord_key', 'eta', 'eta_l', 'tau', 'weighted_by_key']",
        ),
        (
            {"flower": "FedAdam", "args": {"eta": "fast"}},
            "strategy.args.eta: Input should be a valid number (got 'fast')",
        ),
        (
            {"flower": "Krum", "args": {"num_malicious_nodes": 1.5}},
            "strategy.args.num_malicious_nodes: Input should be a valid integer",
        ),
        (
            {"flower": "FedAvg", "args": {"fraction_train": 0.5}},
            "strategy.args.fraction_train: "
            "Flower's node sampling does not apply: geofl's scheduler picks the clients; use "
            "strategy.clients_per_round (times schedule.over_select) instead",
        ),
        (
            {"flower": "FedAvg", "args": {"min_evaluate_nodes": 3}},
            "strategy.args.min_evaluate_nodes: Flower's node sampling does not apply",
        ),
        (
            {"flower": "Bulyan", "args": {"selection_rule": "mod:fn"}},
            "strategy.args."
            "selection_rule: takes a Python object (a callable), which a YAML run cannot express",
        ),
        ({"flower": "QFedAvg"}, "strategy.args: Flower QFedAvg requires client_learning_rate"),
        (
            {"flower": "FedTrimmedAvg", "args": {"beta": 0.7}},
            "strategy.args: Flower FedTrimmedAvg "
            "rejected its arguments: `beta` must be in the range [0, 0.5).",
        ),
        (
            {"name": "fedavg", "flower": "FedAvg"},
            "strategy: name and flower are mutually exclusive",
        ),
        (
            {
                "flower": "DifferentialPrivacyServerSideFixedClipping",
                "args": {**DP, "clipping_norm": 1.0},
            },
            "strategy.wraps: "
            "DifferentialPrivacyServerSideFixedClipping wraps another strategy: set wraps",
        ),
        (
            {"flower": "FedAvg", "wraps": {"flower": "FedAvg"}},
            "strategy.wraps: FedAvg wraps nothing",
        ),
        (
            {
                "flower": "DifferentialPrivacyServerSideFixedClipping",
                "args": {**DP, "clipping_norm": 1.0},
                "wraps": {"flower": "FedAvg", "args": {"eta": 1.0}},
            },
            "strategy.wraps.args.eta: Flower FedAvg takes no argument 'eta'",
        ),
        (
            {
                "flower": "DifferentialPrivacyServerSideFixedClipping",
                "args": {**DP, "clipping_norm": 1.0, "accountant": "x"},
                "wraps": {"flower": "FedAvg"},
            },
            "strategy.args.accountant: takes a Python object (PrivacyAccountant)",
        ),
        (
            {
                "flower": "DifferentialPrivacyServerSideFixedClipping",
                "args": {**DP, "clipping_norm": 1.0},
                "wraps": {"flower": "Krum", "args": {}, "x": 1},
            },
            "strategy.wraps.x: unknown key; allowed keys: args, flower",
        ),
    ],
)
def test_bad_flower_configuration_names_the_key(strategy: dict[str, Any], expected: str) -> None:
    assert _problem(strategy).startswith(expected)


def test_a_bad_argument_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yml"
    path.write_text(
        "run: {name: demo}\nmodel: pkg.task:make_model\nstrategy:\n  flower: FedYogi\n"
        "  args:\n    eta: 0.1\n    tua: 0.01\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:7: strategy.args.tua: Flower FedYogi takes no")


def test_make_strategy_reports_flower_errors_with_the_key() -> None:
    with pytest.raises(ValueError, match=r"strategy 'flower': args.q: Input should be"):
        make_strategy("flower", flower="QFedAvg", args={"client_learning_rate": 0.1, "q": "hi"})
    with pytest.raises(FlowerConfigError) as info:
        FlowerStrategy("FedAvg", {"fraction_evaluate": 0.0})
    assert info.value.path == ("args", "fraction_evaluate")
    assert "evaluation.clients" in info.value.message


def test_importing_geofl_server_does_not_import_flower() -> None:
    code = (
        "import sys, geofl.server, geofl.server.strategies, geofl.server.config, "
        "geofl.server.coordinator\n"
        "print(sorted(m for m in sys.modules if m == 'flwr' or m.startswith('flwr.')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"
