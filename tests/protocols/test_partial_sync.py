"""Partial-sync wire agreement: group encoding and checks, segments, upload order and timing."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols import partial_sync
from geofl.protocols.errors import ProtocolError
from geofl.protocols.partial_sync import (
    STEPS_KEY,
    Groups,
    decode_groups,
    encode_groups,
    groups_of,
    keeps_local,
    pipelined_upload_end,
    segment_steps,
    segments_of,
    tail_segments,
    upload_order,
)
from geofl.protocols.tensors import TensorSpec
from geofl.protocols.types import Scalar

SETTINGS = settings(max_examples=150, deadline=None)
NAMES = ["conv.weight", "conv.bias", "fc.weight", "fc.bias"]

seconds = st.floats(0.0, 1e4, allow_nan=False, allow_infinity=False)


@st.composite
def ready_and_transfer(draw: st.DrawFn) -> tuple[list[float], list[float]]:
    """Non-decreasing ready times (segments end in order) and one transfer time each."""
    gaps = draw(st.lists(seconds, min_size=1, max_size=12))
    ready = [sum(gaps[: k + 1]) for k in range(len(gaps))]
    transfer = draw(st.lists(seconds, min_size=len(ready), max_size=len(ready)))
    return ready, transfer


@st.composite
def partitions(draw: st.DrawFn) -> tuple[list[str], list[list[str]]]:
    """Unique tensor names and a partition of them into ordered non-empty groups."""
    names = draw(st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=12, unique=True))
    shuffled = draw(st.permutations(names))
    cuts = draw(st.sets(st.integers(1, len(names) - 1))) if len(names) > 1 else set()
    bounds = [0, *sorted(cuts), len(names)]
    groups = [list(shuffled[start:end]) for start, end in itertools.pairwise(bounds)]
    return names, groups


# ----------------------------------------------------------------- pipelined upload end


@SETTINGS
@given(ready_and_transfer())
def test_pipelined_end_is_the_latest_group_start_plus_everything_after_it(
    times: tuple[list[float], list[float]],
) -> None:
    ready, transfer = times
    expected = max(ready[k] + sum(transfer[k:]) for k in range(len(ready)))
    assert math.isclose(pipelined_upload_end(ready, transfer), expected, rel_tol=1e-9, abs_tol=1e-9)


@SETTINGS
@given(seconds, seconds)
def test_one_group_ends_when_it_is_ready_plus_its_transfer(ready: float, transfer: float) -> None:
    assert math.isclose(pipelined_upload_end([ready], [transfer]), ready + transfer)


def test_a_transfer_waits_for_the_previous_one_to_finish() -> None:
    # Group 1 is ready at 2 but the link is busy with group 0 until 10.
    assert pipelined_upload_end([1.0, 2.0], [9.0, 3.0]) == 13.0
    # Group 1 is ready after group 0 is through: the link idles in between.
    assert pipelined_upload_end([1.0, 20.0], [2.0, 3.0]) == 23.0


def test_pipelined_end_needs_one_ready_time_per_transfer() -> None:
    with pytest.raises(ValueError, match="one ready time per transfer"):
        pipelined_upload_end([1.0, 2.0], [1.0])


# ----------------------------------------------------------------- segments


@SETTINGS
@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.integers(n, 5000), st.just(n))))
def test_segments_split_all_steps_near_equally(steps_and_segments: tuple[int, int]) -> None:
    local_steps, segments = steps_and_segments
    counts = segment_steps(local_steps, segments)
    assert len(counts) == segments
    assert sum(counts) == local_steps
    assert min(counts) >= 1
    assert max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)  # earlier segments take the extra steps


def test_segment_steps_example() -> None:
    assert segment_steps(7, 3) == [3, 2, 2]
    assert segment_steps(6, 3) == [2, 2, 2]


@SETTINGS
@given(st.integers(2, 64).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
def test_fewer_steps_than_segments_is_an_error(steps_and_segments: tuple[int, int]) -> None:
    local_steps, segments = steps_and_segments
    with pytest.raises(ValueError, match="cannot be split into"):
        segment_steps(local_steps, segments)


def test_zero_segments_is_an_error() -> None:
    with pytest.raises(ValueError, match="0 sync segments"):
        segment_steps(5, 0)


# ----------------------------------------------------------------- group encoding


@SETTINGS
@given(partitions())
def test_groups_round_trip_through_the_config(
    partition: tuple[list[str], list[list[str]]],
) -> None:
    names, groups = partition
    encoded = encode_groups(groups)
    assert isinstance(encoded, str)
    assert decode_groups(encoded, names) == tuple(tuple(group) for group in groups)


def test_groups_of_reads_the_config_key() -> None:
    groups = [["fc.weight", "fc.bias"], ["conv.weight", "conv.bias"]]
    config: dict[str, Scalar] = {partial_sync.CONFIG_KEY: encode_groups(groups), "local_steps": 4}
    assert groups_of(config, NAMES) == (("fc.weight", "fc.bias"), ("conv.weight", "conv.bias"))
    assert groups_of({"local_steps": 4}, NAMES) is None


def test_keep_local_defaults_to_yes() -> None:
    assert keeps_local({})
    assert keeps_local({partial_sync.KEEP_LOCAL_KEY: True})
    assert not keeps_local({partial_sync.KEEP_LOCAL_KEY: False})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[[", "is not JSON"),
        (3, "must be a list of non-empty name lists"),
        ('{"a": 1}', "must be a list of non-empty name lists"),
        ('[["conv.weight"], []]', "must be a list of non-empty name lists"),
        ('[["conv.weight", 7]]', "must be a list of non-empty name lists"),
        ('["conv.weight"]', "must be a list of non-empty name lists"),
    ],
)
def test_malformed_group_values_are_refused(value: str | int, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode_groups(value, NAMES)


def test_a_tensor_the_model_lacks_is_refused() -> None:
    value = encode_groups([["conv.weight", "conv.bias", "fc.weight"], ["fc.bias", "head.w"]])
    with pytest.raises(ProtocolError, match=r"tensors the model does not have: \['head.w'\]"):
        decode_groups(value, NAMES)


def test_a_tensor_in_two_groups_is_refused() -> None:
    value = encode_groups([["conv.weight", "conv.bias", "fc.weight"], ["fc.bias", "conv.bias"]])
    with pytest.raises(ProtocolError, match=r"tensor 'conv.bias' is in sync groups 0 and 1"):
        decode_groups(value, NAMES)


def test_a_tensor_left_out_is_refused_by_name() -> None:
    value = encode_groups([["conv.weight", "conv.bias"], ["fc.weight"]])
    with pytest.raises(ProtocolError, match=r"never synchronize tensors \['fc.bias'\]"):
        decode_groups(value, NAMES)


# ----------------------------------------------------------------- upload order


def _spec() -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(name, "float32", (index + 1,)) for index, name in enumerate(NAMES))


def test_upload_streams_the_tensors_group_by_group() -> None:
    groups: Groups = (("fc.bias", "conv.weight"), ("fc.weight",), ("conv.bias",))
    ordered = upload_order(_spec(), groups)
    assert [tensor.name for tensor in ordered] == [
        "fc.bias",
        "conv.weight",
        "fc.weight",
        "conv.bias",
    ]
    by_name = {tensor.name: tensor for tensor in _spec()}
    assert all(tensor == by_name[tensor.name] for tensor in ordered)


def test_upload_order_checks_the_cover() -> None:
    with pytest.raises(ProtocolError, match="never synchronize"):
        upload_order(_spec(), (("fc.bias",), ("conv.weight",)))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 200), st.integers(1, 8), st.integers(1, 20))
def test_tail_segments_put_the_sync_points_at_the_end(
    local_steps: int, segments: int, tail: int
) -> None:
    if local_steps - (segments - 1) * tail < 1:
        with pytest.raises(ValueError, match="do not fit"):
            tail_segments(local_steps, segments, tail)
        return
    steps = tail_segments(local_steps, segments, tail)
    assert sum(steps) == local_steps and len(steps) == segments
    assert steps[1:] == [tail] * (segments - 1)


def test_segments_of_reads_the_servers_steps_or_splits_evenly() -> None:
    assert segments_of({}, 7, 3) == [3, 2, 2]
    assert segments_of({STEPS_KEY: "[5,1,1]"}, 7, 3) == [5, 1, 1]
    for bad in ("[5,1]", "[5,1,2]", "[6,1,0]", "[5,1,true]", "oops", 3):
        with pytest.raises(ProtocolError, match="sync_steps"):
            segments_of({STEPS_KEY: bad}, 7, 3)
