"""Chunked tensor streams and scalar maps: round trips and every rejection."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols import serde, streams
from geofl.protocols.errors import (
    ChecksumError,
    NonFiniteError,
    ProtocolError,
    TensorError,
    TruncatedStreamError,
)
from geofl.protocols.tensors import SUPPORTED_DTYPES, TensorSpec, check_matches, spec_of
from geofl.protocols.v1 import geofl_pb2 as pb

dtypes = st.sampled_from(SUPPORTED_DTYPES).map(np.dtype)
arrays = dtypes.flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9))
)
models = st.dictionaries(st.text(min_size=1, max_size=8), arrays, min_size=1, max_size=4)


def _roundtrip(weights: dict[str, np.ndarray], chunk: int, **kw: object) -> dict[str, np.ndarray]:
    sink = streams.ArraySink()
    assembler = streams.Assembler(sink, spec_of(weights), **kw)  # type: ignore[arg-type]
    for message in streams.iter_chunks(weights, chunk):
        # Through real bytes, as on the wire.
        assembler.feed(pb.TensorChunk.FromString(message.SerializeToString()))
    assembler.finish()
    return sink.weights


@settings(max_examples=150, deadline=None)
@given(models, st.sampled_from([8, 16, 64, 1024]))
def test_roundtrip_is_bit_exact(weights: dict[str, np.ndarray], chunk: int) -> None:
    received = _roundtrip(weights, chunk)
    assert list(received) == list(weights)
    for name, array in weights.items():
        assert received[name].dtype == array.dtype
        assert received[name].shape == array.shape
        assert received[name].tobytes() == np.ascontiguousarray(array).tobytes()


def test_non_contiguous_and_big_endian_inputs() -> None:
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    weights = {"t": base[:, ::2], "be": np.arange(5, dtype=">i4")}
    received = _roundtrip(weights, 16)
    np.testing.assert_array_equal(received["t"], base[:, ::2])
    np.testing.assert_array_equal(received["be"], np.arange(5))


def test_large_tensor_streams_in_bounded_chunks() -> None:
    weights = {"w": np.ones(3_000_000, np.float32)}
    sizes = [len(c.data) for c in streams.iter_chunks(weights, 1 << 20)]
    assert max(sizes) == 1 << 20 and sum(sizes) == 12_000_000


def _chunks(weights: dict[str, np.ndarray], chunk: int = 16) -> list[pb.TensorChunk]:
    return list(streams.iter_chunks(weights, chunk))


def _feed_all(
    chunks: list[pb.TensorChunk], expected: tuple[TensorSpec, ...] | None, **kw: object
) -> None:
    assembler = streams.Assembler(streams.ArraySink(), expected, **kw)  # type: ignore[arg-type]
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish()


W = {"a": np.arange(10, dtype=np.float32), "b": np.zeros((2, 2), np.int64)}


def test_corrupted_chunk_is_rejected() -> None:
    chunks = _chunks(W)
    chunks[1].data = b"\x00" * len(chunks[1].data)
    with pytest.raises(ChecksumError, match="'a'"):
        _feed_all(chunks, spec_of(W))


def test_reordered_or_missing_chunks_are_rejected() -> None:
    chunks = _chunks(W)
    with pytest.raises(ProtocolError, match="offset"):
        _feed_all([chunks[0], chunks[2], chunks[1], *chunks[3:]], spec_of(W))
    with pytest.raises(TruncatedStreamError, match="stream ended"):
        _feed_all(chunks[:-1], spec_of(W))


def test_wrong_shape_dtype_or_name_is_rejected() -> None:
    for bad in (
        {"a": np.arange(11, dtype=np.float32), "b": W["b"]},
        {"a": np.arange(10, dtype=np.float64), "b": W["b"]},
        {"x": W["a"], "b": W["b"]},
    ):
        with pytest.raises(TensorError, match="expected"):
            _feed_all(_chunks(bad), spec_of(W))
    with pytest.raises(TensorError, match="extra"):
        _feed_all(_chunks({**W, "c": np.ones(1, np.float32)}), spec_of(W))


def test_lying_header_is_rejected() -> None:
    chunks = _chunks(W)
    chunks[0].total_bytes = 8
    with pytest.raises(ProtocolError, match="total_bytes"):
        _feed_all(chunks, None)
    chunks = _chunks(W)
    chunks[0].dtype = pb.DTYPE_UNSPECIFIED
    with pytest.raises(ProtocolError, match="dtype"):
        _feed_all(chunks, None)


def test_size_limit_is_enforced() -> None:
    with pytest.raises(TensorError, match="limit"):
        _feed_all(_chunks(W), None, max_total_bytes=48)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_are_rejected_when_checked(bad: float) -> None:
    weights = {"a": np.array([1.0, bad], np.float32)}
    with pytest.raises(NonFiniteError, match="'a'"):
        _feed_all(_chunks(weights), spec_of(weights), check_finite=True)
    _feed_all(_chunks(weights), spec_of(weights))  # unchecked streams pass it through


def test_check_matches_names_the_difference() -> None:
    with pytest.raises(TensorError, match=r"missing \['b'\]"):
        check_matches(spec_of(W), {"a": W["a"]})
    with pytest.raises(TensorError, match=r"b: int64\[2, 2\]"):
        check_matches(spec_of(W), {"a": W["a"], "b": np.zeros((2, 3), np.int64)})


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
)


@given(st.dictionaries(st.text(), scalars))
def test_scalar_maps_roundtrip(values: dict[str, object]) -> None:
    message = pb.Task()
    serde.fill_scalar_map(message.config, values)  # type: ignore[arg-type]
    decoded = serde.scalar_map(pb.Task.FromString(message.SerializeToString()).config)
    assert decoded == values
    assert all(type(decoded[k]) is type(v) for k, v in values.items())


def test_unsupported_scalar_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="unsupported config/metric value"):
        serde.scalar_to_proto([1, 2])  # type: ignore[arg-type]
