"""The one serialization seam: geofl values <-> protobuf messages of geofl.v1.

Only this module (and the gRPC glue that needs the stub classes) imports the
generated ``*_pb2`` code.  Tensors are raw little-endian bytes, chunked and
checksummed; nothing is pickled.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from google.protobuf.message import DecodeError

from geofl.protocols.errors import (
    ChecksumError,
    NonFiniteError,
    ProtocolError,
    TensorError,
    TruncatedStreamError,
)
from geofl.protocols.tensors import ModelSpec, TensorSpec
from geofl.protocols.types import Scalar, WeightsView
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


# ----------------------------------------------------------------- tensors out


def _wire_bytes(array: npt.NDArray[np.generic]) -> memoryview:
    """Contiguous little-endian bytes of ``array`` without copying when possible."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    flat: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return memoryview(flat)


def iter_chunks(
    weights: WeightsView, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.TensorChunk]:
    """Yield the chunks of every tensor in order; one chunk's copy in memory at a time."""
    if chunk_bytes <= 0 or chunk_bytes % 8:
        raise ValueError(f"chunk_bytes must be a positive multiple of 8, got {chunk_bytes}")
    for name, array in weights.items():
        data = _wire_bytes(array)
        total = len(data)
        offset = 0
        while True:
            piece = bytes(data[offset : offset + chunk_bytes])
            end = offset + len(piece)
            chunk = pb.TensorChunk(
                offset=offset, data=piece, crc32=zlib.crc32(piece), last=end >= total
            )
            if offset == 0:
                chunk.first = True
                chunk.name = name
                chunk.dtype = dtype_to_proto(np.dtype(array.dtype).name)
                chunk.shape.extend(int(d) for d in array.shape)
                chunk.total_bytes = total
            yield chunk
            offset = end
            if offset >= total:
                break


def encode_chunks(weights: WeightsView, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """Serialized :class:`pb.TensorChunk` messages of ``weights`` (for pre-encoded sends)."""
    for chunk in iter_chunks(weights, chunk_bytes):
        yield chunk.SerializeToString()


def encode_upload(
    header: pb.UploadHeader, tensors: WeightsView | None, chunk_bytes: int
) -> Iterator[bytes]:
    """Serialized :class:`pb.UploadMessage` stream: the header, then the tensors' chunks."""
    yield pb.UploadMessage(header=header).SerializeToString()
    for chunk in iter_chunks(tensors or {}, chunk_bytes):
        yield pb.UploadMessage(chunk=chunk).SerializeToString()


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


# ----------------------------------------------------------------- tensors in


class TensorSink(Protocol):
    """Where an :class:`Assembler` puts the bytes of each tensor."""

    def begin(self, spec: TensorSpec) -> None:
        """A new tensor starts."""

    def write(self, data: bytes) -> None:
        """The next piece of the current tensor's bytes."""

    def end(self) -> None:
        """The current tensor is complete and checked."""


class ArraySink:
    """Collects tensors into numpy arrays (a client receiving the global model)."""

    def __init__(self) -> None:
        self.weights: dict[str, npt.NDArray[np.generic]] = {}
        self._current: npt.NDArray[np.uint8] | None = None
        self._filled = 0

    def begin(self, spec: TensorSpec) -> None:
        """Allocate the tensor."""
        array = np.empty(spec.shape, dtype=np.dtype(spec.dtype).newbyteorder("<"))
        self.weights[spec.name] = array
        self._current = array.reshape(-1).view(np.uint8)
        self._filled = 0

    def write(self, data: bytes) -> None:
        """Copy a piece into place."""
        if self._current is None:
            raise ProtocolError("tensor data before the tensor's first chunk")
        self._current[self._filled : self._filled + len(data)] = np.frombuffer(data, np.uint8)
        self._filled += len(data)

    def end(self) -> None:
        """Nothing to do: the array is already in place."""
        self._current = None


class Assembler:
    """Checks a stream of :class:`pb.TensorChunk` and feeds the bytes to a sink.

    Checks: chunk order and offsets, CRC-32, dtype/shape/size against
    ``expected`` (when given) or against the size limit, and, when
    ``check_finite`` is set, that floating-point data holds no NaN or Inf.
    """

    def __init__(
        self,
        sink: TensorSink,
        expected: ModelSpec | None = None,
        *,
        max_total_bytes: int = 1 << 40,
        check_finite: bool = False,
    ) -> None:
        self._sink = sink
        self._expected = expected
        self._max_total = max_total_bytes
        self._check_finite = check_finite
        self._spec: TensorSpec | None = None
        self._offset = 0
        self._received: list[TensorSpec] = []
        self.total_bytes = 0

    def feed(self, chunk: pb.TensorChunk) -> None:
        """Take the next chunk; raise a :class:`ProtocolError` subclass on any fault."""
        if chunk.first:
            self._begin(chunk)
        spec = self._spec
        if spec is None:
            raise ProtocolError("chunk without a preceding first chunk of its tensor")
        if chunk.offset != self._offset:
            raise ProtocolError(
                f"tensor {spec.name!r}: chunk at offset {chunk.offset}, expected {self._offset}"
            )
        data = chunk.data
        if zlib.crc32(data) != chunk.crc32:
            raise ChecksumError(f"tensor {spec.name!r}: checksum mismatch at offset {chunk.offset}")
        end = self._offset + len(data)
        itemsize = np.dtype(spec.dtype).itemsize
        if end > spec.nbytes or (not chunk.last and len(data) % itemsize):
            raise ProtocolError(f"tensor {spec.name!r}: chunk of {len(data)} bytes does not fit")
        finite_checked = self._check_finite and np.dtype(spec.dtype).kind == "f"
        if finite_checked and not np.isfinite(np.frombuffer(data, dtype=spec.dtype)).all():
            raise NonFiniteError(f"tensor {spec.name!r} holds NaN or Inf values")
        self._sink.write(data)
        self._offset = end
        if chunk.last:
            if end != spec.nbytes:
                raise ProtocolError(f"tensor {spec.name!r}: {end} of {spec.nbytes} bytes sent")
            self._sink.end()
            self._received.append(spec)
            self._spec = None

    def _begin(self, chunk: pb.TensorChunk) -> None:
        if self._spec is not None:
            raise ProtocolError(f"tensor {self._spec.name!r} ended without its last chunk")
        spec = TensorSpec(chunk.name, dtype_from_proto(chunk.dtype), tuple(chunk.shape))
        if any(d < 0 for d in spec.shape):
            raise ProtocolError(f"tensor {spec.name!r} has a negative dimension {spec.shape}")
        if chunk.total_bytes != spec.nbytes:
            raise ProtocolError(
                f"tensor {spec.name!r}: total_bytes {chunk.total_bytes} != {spec.nbytes}"
            )
        if self._expected is not None:
            index = len(self._received)
            if index >= len(self._expected):
                raise TensorError(f"unexpected extra tensor {spec.name!r}")
            if self._expected[index] != spec:
                want = self._expected[index].describe()
                raise TensorError(f"expected {want}, got {spec.describe()}")
        self.total_bytes += spec.nbytes
        if self.total_bytes > self._max_total:
            raise TensorError(f"tensors exceed the limit of {self._max_total} bytes")
        self._spec = spec
        self._offset = 0
        self._sink.begin(spec)

    def finish(self) -> ModelSpec:
        """Check the stream ended cleanly; return the received specification."""
        if self._spec is not None:
            raise TruncatedStreamError(f"stream ended inside tensor {self._spec.name!r}")
        if self._expected is not None and len(self._received) != len(self._expected):
            missing = [t.name for t in self._expected[len(self._received) :]]
            raise TruncatedStreamError(f"stream ended before tensors {missing}")
        return tuple(self._received)


__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "ArraySink",
    "Assembler",
    "TensorSink",
    "decode_chunk",
    "decode_upload",
    "dtype_from_proto",
    "dtype_to_proto",
    "encode_chunks",
    "encode_upload",
    "fill_scalar_map",
    "iter_chunks",
    "scalar_from_proto",
    "scalar_map",
    "scalar_to_proto",
]
