"""Layer-group planning for partial sync: balance, drift order, explicit groups, wiring."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols import partial_sync
from geofl.protocols.tensors import ModelSpec, TensorSpec, spec_of
from geofl.protocols.types import Weights
from geofl.server.config import ConfigError, parse_config
from geofl.server.coordinator import build_strategy
from geofl.server.scheduling.partial_sync import (
    LayerSyncPlanner,
    PartialSyncError,
    balanced_groups,
    resolve_groups,
)
from geofl.server.strategies.diloco import DiLoCo

SETTINGS = settings(max_examples=200, deadline=None)
BASE: dict[str, Any] = {"run": {"name": "d", "rounds": 2}, "model": "m:f"}

dtypes = st.sampled_from(["float32", "float64", "float16", "int64", "uint8"])


@st.composite
def specs(draw: st.DrawFn) -> ModelSpec:
    """1-20 tensors of random (possibly empty) sizes and dtypes."""
    sizes = draw(st.lists(st.integers(0, 5000), min_size=1, max_size=20))
    return tuple(TensorSpec(f"t{index}", draw(dtypes), (size,)) for index, size in enumerate(sizes))


@st.composite
def specs_and_points(draw: st.DrawFn) -> tuple[ModelSpec, int]:
    spec = draw(specs())
    return spec, draw(st.integers(1, len(spec)))


def _names(spec: ModelSpec) -> list[str]:
    return [tensor.name for tensor in spec]


def _check_balanced(spec: ModelSpec, points: int, groups: partial_sync.Groups) -> None:
    assert len(groups) == points
    assert all(groups)
    partial_sync.check_cover(groups, _names(spec))  # every tensor exactly once
    size = {tensor.name: tensor.nbytes for tensor in spec}
    total, largest = sum(size.values()), max(size.values())
    for group in groups:
        # bytes <= total / points + largest, in integers.
        assert sum(size[name] for name in group) * points <= total + points * largest


# ----------------------------------------------------------------- balanced groups


@SETTINGS
@given(specs_and_points())
def test_balanced_groups_cover_the_model_in_near_equal_bytes(
    spec_points: tuple[ModelSpec, int],
) -> None:
    spec, points = spec_points
    groups = balanced_groups(spec, points, {})
    _check_balanced(spec, points, groups)
    # Without drift, ties keep model order: the groups are consecutive runs of the model.
    assert [name for group in groups for name in group] == _names(spec)


@SETTINGS
@given(specs_and_points(), st.data())
def test_least_drifting_tensors_are_synchronized_first(
    spec_points: tuple[ModelSpec, int], data: st.DataObject
) -> None:
    spec, points = spec_points
    drift_values = st.floats(0.0, 10.0, allow_nan=False)
    drift = {name: data.draw(drift_values) for name in _names(spec)}
    groups = balanced_groups(spec, points, drift)
    _check_balanced(spec, points, groups)
    if points > 1:
        assert max(drift[name] for name in groups[0]) <= min(drift[name] for name in groups[-1])
    for earlier, later in itertools.pairwise(groups):
        assert max(drift[name] for name in earlier) <= min(drift[name] for name in later)


def test_balanced_groups_example() -> None:
    spec = tuple(TensorSpec(name, "float32", (n,)) for name, n in [("a", 10), ("b", 10), ("c", 20)])
    assert balanced_groups(spec, 2, {}) == (("a", "b"), ("c",))
    # c barely moves: it goes first, and alone is half the bytes.
    assert balanced_groups(spec, 2, {"a": 0.5, "b": 0.2, "c": 0.01}) == (("c",), ("b", "a"))


@pytest.mark.parametrize("points", [4, 7])
def test_too_few_tensors_for_the_sync_points(points: int) -> None:
    spec = tuple(TensorSpec(f"t{i}", "float32", (3,)) for i in range(3))
    with pytest.raises(PartialSyncError, match=f"has 3 tensors, too few for {points} sync groups"):
        balanced_groups(spec, points, {})


def test_zero_sync_points_is_an_error() -> None:
    spec = (TensorSpec("t", "float32", (3,)),)
    with pytest.raises(PartialSyncError, match="sync points must be >= 1"):
        balanced_groups(spec, 0, {})


# ----------------------------------------------------------------- explicit groups

MODEL_SPEC: ModelSpec = (
    TensorSpec("conv1.weight", "float32", (8, 3, 3, 3)),
    TensorSpec("conv1.bias", "float32", (8,)),
    TensorSpec("fc.weight", "float32", (10, 8)),
    TensorSpec("fc.bias", "float32", (10,)),
)


def test_patterns_resolve_to_tensors_in_model_order() -> None:
    # conv1.bias matches two patterns of the same group: that is no conflict.
    groups = resolve_groups(MODEL_SPEC, [["fc.*"], ["conv1.b*", "conv1.*"]])
    assert groups == (("fc.weight", "fc.bias"), ("conv1.weight", "conv1.bias"))


def test_a_pattern_matching_nothing_is_an_error() -> None:
    with pytest.raises(PartialSyncError, match=r"groups\[1\]: pattern 'head\.\*' matches no"):
        resolve_groups(MODEL_SPEC, [["conv1.*", "fc.*"], ["head.*"]])


def test_a_tensor_matching_two_groups_is_an_error() -> None:
    with pytest.raises(PartialSyncError, match=r"tensor 'fc.bias' matches groups 0 and 1"):
        resolve_groups(MODEL_SPEC, [["conv1.*", "*.bias"], ["fc.*"]])


def test_a_tensor_matching_no_group_is_named() -> None:
    with pytest.raises(PartialSyncError, match=r"never synchronizes tensors \['fc.bias'\]"):
        resolve_groups(MODEL_SPEC, [["conv1.*"], ["fc.weight"]])


def test_the_planner_uses_explicit_groups_and_checks_their_count() -> None:
    planner = LayerSyncPlanner(2, [["conv1.*"], ["fc.*"]])
    assert planner.groups(MODEL_SPEC) == (("conv1.weight", "conv1.bias"), ("fc.weight", "fc.bias"))
    with pytest.raises(PartialSyncError, match="3 explicit groups for 2 sync points"):
        LayerSyncPlanner(2, [["conv1.*"], ["fc.weight"], ["fc.bias"]])


# ----------------------------------------------------------------- drift


finite = st.floats(-100.0, 100.0, allow_nan=False, width=32)


@SETTINGS
@given(
    st.lists(finite, min_size=1, max_size=8).filter(lambda v: np.linalg.norm(v) > 1e-3),
    st.lists(finite, min_size=8, max_size=8),
    st.lists(finite, min_size=8, max_size=8),
)
def test_drift_is_the_smoothed_relative_change(
    start: list[float], first: list[float], second: list[float]
) -> None:
    size = len(start)
    old = np.array(start)
    middle = old + np.array(first[:size])
    new = middle - np.array(second[:size])
    planner = LayerSyncPlanner(2)
    planner.observe({"w": old}, {"w": middle})
    relative1 = np.linalg.norm(middle - old) / np.linalg.norm(old)
    assert planner.drift["w"] == pytest.approx(relative1, rel=1e-6, abs=1e-9)
    planner.observe({"w": middle}, {"w": new})
    relative2 = np.linalg.norm(new - middle) / (np.linalg.norm(middle) + 1e-12)
    assert planner.drift["w"] == pytest.approx(0.5 * relative2 + 0.5 * relative1, rel=1e-6)


def test_drift_example_and_what_it_ignores() -> None:
    planner = LayerSyncPlanner(2)
    old = {"w": np.array([3.0, 4.0]), "steps": np.array([5]), "gone": np.ones(2)}
    planner.observe(old, {"w": np.array([3.5, 4.0]), "steps": np.array([9])})
    assert planner.drift == pytest.approx({"w": 0.1})  # ||0.5|| / ||(3, 4)||
    planner.observe({"w": np.array([3.0, 4.0])}, {"w": np.array([3.0, 5.5])})
    assert planner.drift == pytest.approx({"w": 0.5 * 0.3 + 0.5 * 0.1})
    planner.drift["w"] = 99.0  # a copy: the planner's own view is unchanged
    assert planner.drift["w"] == pytest.approx(0.2)


def test_planned_groups_follow_the_observed_drift() -> None:
    weights = {name: np.ones(8) for name in ("a", "b", "c", "d")}
    planner = LayerSyncPlanner(2)
    spec = spec_of(weights)
    assert planner.groups(spec) == (("a", "b"), ("c", "d"))
    moved = {**weights, "a": np.full(8, 3.0), "b": np.full(8, 2.0)}
    planner.observe(weights, moved)
    assert planner.groups(spec) == (("c", "d"), ("b", "a"))


# ----------------------------------------------------------------- DiLoCo wiring


def _model(seed: int) -> Weights:
    rng = np.random.default_rng(seed)
    return {
        "l1.weight": rng.standard_normal((3, 4)).astype(np.float32),
        "l1.bias": rng.standard_normal(3).astype(np.float32),
        "l2.weight": rng.standard_normal((2, 3)).astype(np.float32),
        "l2.bias": rng.standard_normal(2).astype(np.float32),
        "steps": np.array([4], dtype=np.int64),
    }


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 5), st.booleans())
def test_diloco_sends_valid_groups_and_steps_as_without_them(
    seed: int, points: int, keep_local: bool
) -> None:
    rng = np.random.default_rng(seed + 1)
    planned = DiLoCo(0.7, 0.9, layer_sync=LayerSyncPlanner(points, keep_local=keep_local))
    plain = DiLoCo(0.7, 0.9)
    weights = expected = _model(seed)
    for server_round in (1, 2, 3):
        planned.begin_round(weights)
        config = planned.configure_fit(server_round, {"local_steps": 9})
        groups = partial_sync.decode_groups(config[partial_sync.CONFIG_KEY], list(weights))
        assert len(groups) == points
        assert config[partial_sync.KEEP_LOCAL_KEY] is keep_local
        assert config["local_steps"] == 9
        assert partial_sync.CONFIG_KEY not in plain.configure_fit(server_round, {})
        delta = {
            name: (rng.standard_normal(v.shape) if v.dtype.kind == "f" else np.ones_like(v))
            for name, v in weights.items()
        }
        new = planned.apply(weights, delta, server_round)
        expected = plain.apply(expected, delta, server_round)
        assert list(new) == list(expected)
        for name in new:
            np.testing.assert_array_equal(new[name], expected[name])
        weights = new
    assert set(planned.layer_sync.drift if planned.layer_sync else {}) == {
        "l1.weight",
        "l1.bias",
        "l2.weight",
        "l2.bias",
    }


def test_diloco_apply_teaches_the_planner_the_outer_step() -> None:
    planner = LayerSyncPlanner(2)
    strategy = DiLoCo(1.0, 0.0, layer_sync=planner)
    weights = {"a": np.full(4, 2.0), "b": np.full(4, 2.0)}
    strategy.apply(weights, {"a": np.full(4, 1.0), "b": np.zeros(4)}, 1)
    assert planner.drift == pytest.approx({"a": 0.5, "b": 0.0})


# ----------------------------------------------------------------- configuration


def _diloco(partial: dict[str, Any], **sections: Any) -> dict[str, Any]:
    schedule = {"mode": "diloco", "diloco": {"local_steps": 4}, "partial_sync": partial}
    return {**BASE, "schedule": schedule, **sections}


LINK = {"share": 1.0, "rtt_ms": 0, "up_mbps": 100, "down_mbps": 100}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {**BASE, "schedule": {"partial_sync": {"sync_points": 2}}},
            r"partial_sync needs schedule\.mode diloco",
        ),
        (_diloco({"sync_points": 5}), r"has 5 sync points but rounds have 4 local steps"),
        (_diloco({"sync_points": 1}), r"sync_points 1 sends the whole model"),
        (
            _diloco({"sync_points": 3, "groups": [["l1.*"], ["l2.*"]]}),
            r"sync_points 3 but 2 groups are given",
        ),
        (_diloco({"groups": [["l1.*"], []]}), r"groups must be non-empty lists"),
        (
            _diloco({"sync_points": 2}, secure_aggregation={"enabled": True}),
            r"cannot be combined with secure_aggregation",
        ),
        (
            _diloco({"sync_points": 2}, simulation={"relays": True, "regions": {"a": LINK}}),
            r"cannot be combined with simulation\.relays",
        ),
    ],
)
def test_partial_sync_config_errors(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, source="t")


def test_build_strategy_plans_the_configured_groups() -> None:
    spec = spec_of(_model(0))
    planned = build_strategy(parse_config(_diloco({"sync_points": 3}), source="t"))
    assert isinstance(planned, DiLoCo) and isinstance(planned.layer_sync, LayerSyncPlanner)
    assert planned.layer_sync.points == 3 and planned.layer_sync.keep_local
    assert planned.layer_sync.groups(spec) == balanced_groups(spec, 3, {})

    explicit = _diloco({"groups": [["l2.*"], ["l1.*", "steps"]], "keep_local": False})
    strategy = build_strategy(parse_config(explicit, source="t"))
    assert isinstance(strategy, DiLoCo) and strategy.layer_sync is not None
    assert not strategy.layer_sync.keep_local
    assert strategy.layer_sync.groups(spec) == (
        ("l2.weight", "l2.bias"),
        ("l1.weight", "l1.bias", "steps"),
    )

    off = build_strategy(parse_config(_diloco({}), source="t"))
    assert isinstance(off, DiLoCo) and off.layer_sync is None


def test_round_config_sends_the_tail_segments_or_refuses_them() -> None:
    spec = (TensorSpec("a", "float32", (4,)), TensorSpec("b", "float32", (4,)))
    planner = LayerSyncPlanner(2, tail_steps=3)
    config = planner.round_config(spec, {"local_steps": 10})
    assert json.loads(str(config[partial_sync.STEPS_KEY])) == [7, 3]
    assert partial_sync.decode_groups(config[partial_sync.CONFIG_KEY], ["a", "b"]) == (
        ("a",),
        ("b",),
    )
    with pytest.raises(PartialSyncError, match="do not fit"):
        planner.round_config(spec, {"local_steps": 3})
    with pytest.raises(PartialSyncError, match="integer local_steps"):
        planner.round_config(spec, {})
    assert partial_sync.STEPS_KEY not in LayerSyncPlanner(2).round_config(spec, {})
