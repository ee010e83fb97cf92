"""Chunks written and read outside protobuf: the same bytes, the same values, no aliasing.

The bulk paths build serialized chunks by hand (one copy of the data) and read a chunk's
data as a view of the received bytes. These tests pin both to protobuf's own serialization
and parsing, and check that reused buffers never leak into a message or a sink.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols import serde, streams
from geofl.protocols.codecs import CodecStep, encode_tensor
from geofl.protocols.errors import ProtocolError
from geofl.protocols.tensors import Difference, EncodedTensor
from geofl.protocols.v1 import geofl_pb2 as pb

floats = hnp.arrays(
    np.float32,
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=40),
    elements=st.floats(-1e6, 1e6, width=32),
)
chunk_sizes = st.sampled_from([8, 16, 64, 1024, 1 << 20])


def _protobuf_chunks(tensors: dict[str, streams.Tensorish], chunk: int) -> list[bytes]:
    return [c.SerializeToString() for c in streams.iter_chunks(tensors, chunk)]


def _mixed_model() -> dict[str, streams.Tensorish]:
    rng = np.random.default_rng(3)
    new, base = rng.random((33, 5)).astype(np.float32), rng.random((33, 5)).astype(np.float32)
    chain = (CodecStep("fp16", {}),)
    values = rng.random(70).astype(np.float32)
    return {
        "dense": rng.random((17, 3)).astype(np.float64),
        "delta": Difference(new, base),
        "big_endian": np.arange(12, dtype=">i4").reshape(3, 4),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "scalar": np.array(2.5, dtype=np.float32),
        "packed": EncodedTensor(
            encode_tensor(values, chain, seed=0), chain, "float32", (70,), True
        ),
    }


@pytest.mark.parametrize("chunk", [8, 24, 64, 4096])
def test_hand_built_chunks_are_protobufs_own_bytes(chunk: int) -> None:
    tensors = _mixed_model()
    expected = _protobuf_chunks(tensors, chunk)
    assert list(streams.encode_chunks(tensors, chunk)) == expected
    wrapped = [
        pb.UploadMessage(chunk=pb.TensorChunk.FromString(raw)).SerializeToString()
        for raw in expected
    ]
    assert list(streams.encode_upload_chunks(tensors, chunk)) == wrapped


@settings(deadline=None, max_examples=60)
@given(floats, floats, chunk_sizes)
def test_differences_stream_as_protobuf_would(
    new: np.ndarray, other: np.ndarray, chunk: int
) -> None:
    base = np.resize(other, new.shape).astype(np.float32) if new.size else new.copy()
    tensors: dict[str, streams.Tensorish] = {"d": Difference(new, base)}
    assert list(streams.encode_chunks(tensors, chunk)) == _protobuf_chunks(tensors, chunk)


def test_difference_pieces_do_not_share_the_reused_buffer() -> None:
    """Every message is complete when yielded: later pieces must not overwrite earlier ones
    (the difference is computed into one buffer that is reused for every piece)."""
    rng = np.random.default_rng(0)
    new = rng.random(10_000).astype(np.float32)
    base = rng.random(10_000).astype(np.float32)
    messages = list(streams.encode_upload_chunks({"w": Difference(new, base)}, 1024))
    assert len(messages) > 5
    sink = streams.ArraySink()
    assembler = streams.Assembler(sink)
    for raw in messages:  # all produced before any is read
        message, data = serde.decode_upload_view(raw)
        assembler.feed(message.chunk, data)
    assembler.finish()
    np.testing.assert_array_equal(sink.weights["w"], new - base)


@pytest.mark.parametrize("chunk", [8, 40, 4096])
def test_views_decode_to_what_protobuf_parses(chunk: int) -> None:
    for raw in streams.encode_chunks(_mixed_model(), chunk):
        meta, data = serde.decode_chunk_view(raw)
        parsed = pb.TensorChunk.FromString(raw)
        assert bytes(data) == parsed.data
        assert meta.data == b""
        meta.data = bytes(data)
        assert meta == parsed
    for raw in streams.encode_upload_chunks(_mixed_model(), chunk):
        message, data = serde.decode_upload_view(raw)
        full = pb.UploadMessage.FromString(raw)
        assert bytes(data) == full.chunk.data
        message.chunk.data = bytes(data)
        assert message == full


def test_headers_and_trailers_are_parsed_whole() -> None:
    header = pb.UploadHeader(task_id=7, round=2, num_examples=5)
    for message in (pb.UploadMessage(header=header), pb.UploadMessage(trailer=header)):
        parsed, data = serde.decode_upload_view(message.SerializeToString())
        assert parsed == message
        assert data == b""


def test_unusual_but_valid_chunks_get_protobufs_reading() -> None:
    """A repeated data field (last one wins), unknown fields, fields out of order."""
    first = pb.TensorChunk(data=b"first", crc32=5).SerializeToString()
    second = pb.TensorChunk(data=b"second!!", offset=8).SerializeToString()
    unknown = bytes([0x98, 0x06, 0x01])  # field 99, varint 1
    for raw in (first + second, unknown + first, second + unknown):
        meta, data = serde.decode_chunk_view(raw)
        parsed = pb.TensorChunk.FromString(raw)
        assert bytes(data) == parsed.data
        assert (meta.offset, meta.crc32) == (parsed.offset, parsed.crc32)
        upload = bytes([0x12, len(raw)]) + raw
        message, view = serde.decode_upload_view(upload)
        assert bytes(view) == pb.UploadMessage.FromString(upload).chunk.data
        assert message.chunk.offset == parsed.offset


def test_two_chunk_bodies_merge_as_protobuf_merges_them() -> None:
    a = pb.UploadMessage(chunk=pb.TensorChunk(offset=1, data=b"aaaa")).SerializeToString()
    b = pb.UploadMessage(chunk=pb.TensorChunk(crc32=9)).SerializeToString()
    message, data = serde.decode_upload_view(a + b)
    full = pb.UploadMessage.FromString(a + b)
    assert bytes(data) == full.chunk.data
    assert (message.chunk.offset, message.chunk.crc32) == (1, 9)


@settings(deadline=None, max_examples=200)
@given(st.binary(max_size=64))
def test_garbage_is_rejected_or_read_exactly_as_protobuf_reads_it(raw: bytes) -> None:
    try:
        expected = pb.TensorChunk.FromString(raw)
    except Exception:
        with pytest.raises(ProtocolError):
            serde.decode_chunk_view(raw)
    else:
        meta, data = serde.decode_chunk_view(raw)
        assert bytes(data) == expected.data
        meta.data = bytes(data)
        assert meta == expected
    try:
        expected_upload = pb.UploadMessage.FromString(raw)
    except Exception:
        with pytest.raises(ProtocolError):
            serde.decode_upload_view(raw)
    else:
        message, view = serde.decode_upload_view(raw)
        if message.WhichOneof("body") == "chunk":
            message.chunk.data = bytes(view)
        assert message == expected_upload


def test_truncated_chunks_are_protocol_errors() -> None:
    raw = next(streams.encode_upload_chunks({"w": np.arange(64, dtype=np.float32)}, 1 << 20))
    for cut in (1, 2, 5, len(raw) // 2, len(raw) - 1):
        with pytest.raises(ProtocolError):
            serde.decode_upload_view(raw[:cut])


def test_sinks_copy_views_before_the_sender_reuses_them() -> None:
    """A sink fed a view keeps its own copy: rewriting the view's memory changes nothing."""
    values = np.arange(32, dtype=np.float32)
    sink = streams.ArraySink()
    assembler = streams.Assembler(sink)
    buffer = bytearray(64)
    for chunk in streams.iter_chunks({"w": values}, 64):
        data = memoryview(buffer)[: len(chunk.data)]
        data[:] = chunk.data
        chunk.data = b""
        assembler.feed(chunk, data)
        buffer[:] = bytes(len(buffer))  # the "sender" reuses its buffer
    assembler.finish()
    np.testing.assert_array_equal(sink.weights["w"], values)


def test_crc32_is_zlibs_checksum() -> None:
    import zlib

    data = np.random.default_rng(1).bytes(100_003)
    assert serde.crc32(data) == zlib.crc32(data)
    assert serde.crc32(memoryview(data)[7:999]) == zlib.crc32(data[7:999])
