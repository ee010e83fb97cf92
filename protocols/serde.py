"""The serialization seam: geofl values <-> protobuf messages of geofl.v1.

This module and :mod:`geofl.protocols.streams` (tensor chunk streams) are where
geofl values meet the generated ``*_pb2`` code; the gRPC glue only adds stubs.
Tensors are raw little-endian bytes, chunked and checksummed; nothing is pickled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from google.protobuf.message import DecodeError

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
    "decode_chunk",
    "decode_upload",
    "dtype_from_proto",
    "dtype_to_proto",
    "fill_scalar_map",
    "plan_from_proto",
    "plan_to_proto",
    "scalar_from_proto",
    "scalar_map",
    "scalar_to_proto",
]
