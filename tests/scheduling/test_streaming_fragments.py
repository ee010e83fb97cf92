"""Streaming DiLoCo's fragments: every tensor in exactly one, synchronized in turn."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols import streaming
from geofl.protocols.errors import ProtocolError
from geofl.protocols.tensors import ModelSpec, TensorSpec
from geofl.server.scheduling.streaming import FragmentSchedule, StreamingError


def _spec(sizes: list[int]) -> ModelSpec:
    return tuple(TensorSpec(f"t{i}", "float32", (size,)) for i, size in enumerate(sizes))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    data=st.data(),
)
def test_fragments_cover_the_model_exactly_once_in_model_order(
    sizes: list[int], data: st.DataObject
) -> None:
    spec = _spec(sizes)
    fragments = data.draw(st.integers(1, len(spec)))
    groups = FragmentSchedule(fragments, stride=4, overlap=1, alpha=0.5).groups(spec)
    assert len(groups) == fragments and all(groups)
    flattened = [name for group in groups for name in group]
    assert flattened == [tensor.name for tensor in spec]  # each once, consecutive runs


def test_rounds_rotate_through_the_fragments_and_merge_the_previous_one() -> None:
    spec = _spec([10, 10, 10, 10, 10, 10])
    schedule = FragmentSchedule(3, stride=5, overlap=2, alpha=0.25)
    groups = schedule.groups(spec)
    names = [t.name for t in spec]
    seen = []
    for server_round in range(1, 8):
        config = schedule.round_config(spec, server_round)
        plan = streaming.streaming_round(config, names)
        seen.append(plan.fragment)
        expected_merge = groups[(server_round - 2) % 3] if server_round > 1 else ()
        assert plan.merge == expected_merge
        assert (plan.local_steps, plan.overlap, plan.alpha) == (5, 2, 0.25)
        assert plan.steps_before_send == 3
    assert seen == [groups[0], groups[1], groups[2]] * 2 + [groups[0]]


def test_explicit_fragments_must_cover_every_tensor_once() -> None:
    spec = _spec([4, 4, 4])
    assert FragmentSchedule(2, 2, 0, 0.0, [["t0", "t2"], ["t1"]]).groups(spec) == (
        ("t0", "t2"),
        ("t1",),
    )
    with pytest.raises(StreamingError, match=r"schedule\.streaming\.groups never synchronizes"):
        FragmentSchedule(2, 2, 0, 0.0, [["t0"], ["t1"]]).groups(spec)
    with pytest.raises(StreamingError, match=r"'t1' matches groups 0 and 1"):
        FragmentSchedule(2, 2, 0, 0.0, [["t*"], ["t1"]]).groups(spec)
    with pytest.raises(StreamingError, match=r"too few for 4 sync groups; set schedule\.streaming"):
        FragmentSchedule(4, 2, 0, 0.0).groups(spec)


@pytest.mark.parametrize(
    ("fragments", "stride", "overlap", "alpha"),
    [(0, 2, 0, 0.5), (2, 0, 0, 0.5), (2, 2, 2, 0.5), (2, 2, -1, 0.5), (2, 2, 1, 1.5)],
)
def test_a_schedule_that_cannot_run_is_refused(
    fragments: int, stride: int, overlap: int, alpha: float
) -> None:
    with pytest.raises(StreamingError, match="streaming schedule needs"):
        FragmentSchedule(fragments, stride, overlap, alpha)


def test_malformed_round_configs_are_protocol_errors() -> None:
    names = ["a", "b"]
    good = {
        streaming.FRAGMENT_KEY: '["a"]',
        streaming.MERGE_KEY: "[]",
        streaming.OVERLAP_KEY: 1,
        streaming.ALPHA_KEY: 0.5,
        "local_steps": 2,
    }
    assert streaming.streaming_round(good, names).fragment == ("a",)
    bad = [
        ({streaming.FRAGMENT_KEY: '["c"]'}, "does not have"),
        ({streaming.FRAGMENT_KEY: "[]"}, "names no tensor"),
        ({streaming.FRAGMENT_KEY: '["a", "a"]'}, "twice"),
        ({streaming.MERGE_KEY: "{"}, "not JSON"),
        ({streaming.OVERLAP_KEY: 2}, "< local_steps"),
        ({streaming.OVERLAP_KEY: "1"}, "integer"),
        ({streaming.ALPHA_KEY: 2.0}, r"\[0, 1\]"),
    ]
    for change, message in bad:
        with pytest.raises(ProtocolError, match=message):
            streaming.streaming_round({**good, **change}, names)


def test_the_upload_carries_the_fragment_in_model_order() -> None:
    spec = _spec([1, 2, 3])
    config = {streaming.FRAGMENT_KEY: json.dumps(["t2", "t0"])}
    assert [t.name for t in streaming.expected_upload(spec, config)] == ["t0", "t2"]
    assert streaming.expected_upload(spec, {}) == spec
