"""The serialization seam: geofl values <-> protobuf messages of geofl.v1.

This module and :mod:`geofl.protocols.streams` (tensor chunk streams) are where
geofl values meet the generated ``*_pb2`` code; the gRPC glue only adds stubs.
Tensors are raw little-endian bytes, chunked and checksummed; nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from google.protobuf.message import DecodeError
from zlib_ng import zlib_ng

from geofl.protocols.codecs import Chain, CodecStep, check_chain
from geofl.protocols.compression import UploadPlan
from geofl.protocols.errors import ProtocolError, TensorError
from geofl.protocols.types import Scalar
from geofl.protocols.v1 import geofl_pb2 as pb

#: Default payload per chunk: far below gRPC's 4 MiB message limit.
DEFAULT_CHUNK_BYTES = 1 << 20

_DTYPE_TO_PROTO: dict[str, pb.DType] = {
    "float32": pb.DTYPE_FLOAT32,
    "float64": pb.DTYPE_FLOAT64,
    "float16": pb.DTYPE_FLOAT16,
    "int8": pb.DTYPE_INT8,
    "int16": pb.DTYPE_INT16,
    "int32": pb.DTYPE_INT32,
    "int64": pb.DTYPE_INT64,
    "uint8": pb.DTYPE_UINT8,
    "uint16": pb.DTYPE_UINT16,
    "uint32": pb.DTYPE_UINT32,
    "bool": pb.DTYPE_BOOL,
}
_PROTO_TO_DTYPE: dict[int, str] = {int(v): k for k, v in _DTYPE_TO_PROTO.items()}


def dtype_to_proto(dtype: str) -> pb.DType:
    """The wire enum of a numpy dtype name."""
    try:
        return _DTYPE_TO_PROTO[dtype]
    except KeyError:
        raise TensorError(f"dtype {dtype!r} cannot travel on the wire") from None


def dtype_from_proto(value: int) -> str:
    """The numpy dtype name of a wire enum value."""
    try:
        return _PROTO_TO_DTYPE[value]
    except KeyError:
        raise ProtocolError(f"unknown or unspecified dtype enum value {value}") from None


# ----------------------------------------------------------------- scalars


def scalar_to_proto(value: Scalar) -> pb.Scalar:
    """Wrap a config or metric value."""
    if isinstance(value, bool):
        return pb.Scalar(bool=value)
    if isinstance(value, int):
        return pb.Scalar(int=value)
    if isinstance(value, float):
        return pb.Scalar(double=value)
    if isinstance(value, str):
        return pb.Scalar(string=value)
    if isinstance(value, bytes):
        return pb.Scalar(bytes=value)
    if isinstance(value, np.generic):
        return scalar_to_proto(value.item())
    raise TypeError(f"unsupported config/metric value {value!r} of type {type(value).__name__}")


def scalar_from_proto(message: pb.Scalar) -> Scalar:
    """Unwrap a config or metric value."""
    kind = message.WhichOneof("value")
    if kind is None:
        raise ProtocolError("empty Scalar")
    value: Scalar = getattr(message, kind)
    return value


def fill_scalar_map(target: Mapping[str, pb.Scalar], values: Mapping[str, Scalar]) -> None:
    """Copy ``values`` into a protobuf ``map<string, Scalar>`` field."""
    for key, value in values.items():
        target[key].CopyFrom(scalar_to_proto(value))


def scalar_map(source: Mapping[str, pb.Scalar]) -> dict[str, Scalar]:
    """A protobuf ``map<string, Scalar>`` as a plain dict."""
    return {key: scalar_from_proto(value) for key, value in source.items()}


# ----------------------------------------------------------------- bulk messages


def decode_chunk(raw: bytes) -> pb.TensorChunk:
    """Parse one serialized chunk; a malformed one is a :class:`ProtocolError`."""
    try:
        return pb.TensorChunk.FromString(raw)
    except DecodeError as exc:
        raise ProtocolError(f"malformed TensorChunk ({len(raw)} bytes): {exc}") from None


def decode_upload(raw: bytes) -> pb.UploadMessage:
    """Parse one serialized upload message; a malformed one is a :class:`ProtocolError`."""
    try:
        return pb.UploadMessage.FromString(raw)
    except DecodeError as exc:
        raise ProtocolError(f"malformed UploadMessage ({len(raw)} bytes): {exc}") from None


# ----------------------------------------------------------------- chunks without copies
#
# A chunk's ``data`` is almost all of its bytes. Letting protobuf build and parse it costs
# several full copies per chunk (the field, the enclosing UploadMessage, the serialized
# string; on receipt the parsed field and a new ``bytes``), so the bulk paths write and
# read that one field themselves. The rest of the chunk still goes through protobuf, and
# the bytes written are exactly what ``SerializeToString`` gives (tested).

#: Wire tags: TensorChunk.data (6, length-delimited), TensorChunk.crc32 (7, fixed32),
#: UploadMessage.chunk (2, length-delimited).
_DATA_TAG = b"\x32"
_CRC_TAG = b"\x3d"
_UPLOAD_CHUNK_TAG = 0x12
_DATA_FIELD = 6
_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


def crc32(data: bytes | memoryview) -> int:
    """The CRC-32 of a chunk's data (zlib's checksum, computed by zlib-ng's SIMD code)."""
    return int(zlib_ng.crc32(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_chunk(
    head: pb.TensorChunk,
    data: bytes | memoryview,
    crc: int,
    tail: pb.TensorChunk,
    *,
    upload: bool = False,
) -> bytes:
    """A serialized :class:`pb.TensorChunk` (``upload``: wrapped in a :class:`pb.UploadMessage`).

    ``head`` holds the chunk's fields numbered below ``data`` (name, dtype, shape,
    total_bytes, offset) and ``tail`` those above ``crc32`` (first, last, encoding,
    add_to_base), so the result is byte for byte protobuf's serialization of the whole
    chunk. ``data`` is copied once, into the result: the caller may reuse its buffer.
    """
    parts: list[bytes | memoryview] = [head.SerializeToString()]
    size = memoryview(data).nbytes
    if size:
        parts += [_DATA_TAG, _varint(size), data]
    if crc:
        parts += [_CRC_TAG, crc.to_bytes(4, "little")]
    parts.append(tail.SerializeToString())
    if upload:
        inner = sum(memoryview(p).nbytes for p in parts)
        parts[:0] = [bytes([_UPLOAD_CHUNK_TAG]), _varint(inner)]
    return b"".join(parts)


def _read_varint(raw: memoryview, pos: int, end: int) -> tuple[int, int] | None:
    value = shift = 0
    while pos < end and shift < 64:
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None


def _data_span(raw: memoryview, pos: int, end: int) -> tuple[int, int, int] | None:
    """Where the one ``data`` field of the chunk in ``raw[pos:end]`` is: (field start,
    value start, value end); ``(end, end, end)`` when it has none.

    None for anything but a plain, well-formed chunk (a repeated ``data`` field, a group,
    a field running past the end): the caller then lets protobuf parse it all, so odd
    input gets protobuf's own verdict.
    """
    span: tuple[int, int, int] | None = None
    while pos < end:
        start = pos
        tag = _read_varint(raw, pos, end)
        if tag is None:
            return None
        key, pos = tag
        kind = key & 7
        if kind == _VARINT:
            skipped = _read_varint(raw, pos, end)
            if skipped is None:
                return None
            pos = skipped[1]
        elif kind in (_FIXED64, _FIXED32):
            pos += 8 if kind == _FIXED64 else 4
        elif kind == _LENGTH:
            length = _read_varint(raw, pos, end)
            if length is None:
                return None
            value_start, pos = length[1], length[1] + length[0]
            if key >> 3 == _DATA_FIELD:
                if span is not None:
                    return None
                span = (start, value_start, pos)
        else:
            return None
        if pos > end:
            return None
    return span if span is not None else (end, end, end)


def _split_chunk(raw: bytes, pos: int) -> tuple[pb.TensorChunk, memoryview] | None:
    """The chunk serialized in ``raw[pos:]`` without its data, and a view of the data."""
    view = memoryview(raw)
    span = _data_span(view, pos, len(raw))
    if span is None:
        return None
    field, start, stop = span
    try:
        meta = pb.TensorChunk.FromString(raw[pos:field] + raw[stop:])
    except DecodeError:
        return None
    return meta, view[start:stop]


def decode_chunk_view(raw: bytes) -> tuple[pb.TensorChunk, bytes | memoryview]:
    """:func:`decode_chunk`, with the data as a view of ``raw`` instead of a copy.

    The returned chunk's own ``data`` field is empty; the second value is the data.
    """
    split = _split_chunk(raw, 0)
    if split is not None:
        return split
    chunk = decode_chunk(raw)
    return chunk, chunk.data


def decode_upload_view(raw: bytes) -> tuple[pb.UploadMessage, bytes | memoryview]:
    """:func:`decode_upload`; for a chunk, its data as a view of ``raw`` (see
    :func:`decode_chunk_view`). The second value is empty for a header or trailer.
    """
    view = memoryview(raw)
    if raw[:1] == bytes([_UPLOAD_CHUNK_TAG]):
        length = _read_varint(view, 1, len(raw))
        if length is not None and length[1] + length[0] == len(raw):
            split = _split_chunk(raw, length[1])
            if split is not None:
                return pb.UploadMessage(chunk=split[0]), split[1]
    message = decode_upload(raw)
    data = message.chunk.data if message.WhichOneof("body") == "chunk" else b""
    return message, data


# ----------------------------------------------------------------- codec chains


def chain_to_proto(chain: Chain) -> list[pb.CodecStep]:
    """Wire form of a codec chain."""
    steps = []
    for step in chain:
        message = pb.CodecStep(codec=step.codec.wire_id)  # type: ignore[arg-type]
        fill_scalar_map(message.params, dict(step.params))
        steps.append(message)
    return steps


def chain_from_proto(steps: Iterable[pb.CodecStep]) -> Chain:
    """A codec chain a peer announced; :class:`CodecError` if unknown or invalid."""
    chain = tuple(CodecStep.from_wire(int(s.codec), scalar_map(s.params)) for s in steps)
    check_chain(chain)
    return chain


def plan_to_proto(plan: UploadPlan) -> pb.CompressionPlan:
    """Wire form of an upload plan."""
    message = pb.CompressionPlan(
        min_bytes=plan.min_bytes,
        error_feedback=plan.error_feedback,
        max_staleness=plan.max_staleness,
    )
    message.steps.extend(chain_to_proto(plan.chain))
    return message


def plan_from_proto(message: pb.CompressionPlan) -> UploadPlan:
    """The upload plan a server sent."""
    return UploadPlan(
        chain_from_proto(message.steps),
        int(message.min_bytes),
        bool(message.error_feedback),
        int(message.max_staleness),
    )


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "chain_from_proto",
    "chain_to_proto",
    "crc32",
    "decode_chunk",
    "decode_chunk_view",
    "decode_upload",
    "decode_upload_view",
    "dtype_from_proto",
    "dtype_to_proto",
    "encode_chunk",
    "fill_scalar_map",
    "plan_from_proto",
    "plan_to_proto",
    "scalar_from_proto",
    "scalar_map",
    "scalar_to_proto",
]
