"""Tensors as chunked, checksummed streams, raw or compressed.

A tensor travels as a run of :class:`pb.TensorChunk` messages: the first carries its
name, dtype and shape (and, for a compressed tensor, its :class:`pb.Encoding`; the
chunks then carry the codec payload as uint8), every chunk its offset and CRC-32.
Senders hold one chunk's copy at a time; receivers check everything before a byte
reaches a sink.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from geofl.protocols import serde
from geofl.protocols.codecs import Chain, decode_tensor
from geofl.protocols.errors import ChecksumError, ProtocolError, TruncatedStreamError
from geofl.protocols.tensor_checks import TensorCheck
from geofl.protocols.tensors import (
    Difference,
    EncodedTensor,
    ModelSpec,
    Tensorish,
    TensorSpec,
)
from geofl.protocols.types import WeightsView
from geofl.protocols.v1 import geofl_pb2 as pb

# ----------------------------------------------------------------- sending


def _little_endian(array: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1)


def _wire_bytes(item: npt.NDArray[np.generic] | EncodedTensor) -> memoryview:
    """Contiguous little-endian bytes of an array (no copy when possible) or a payload."""
    if isinstance(item, EncodedTensor):
        return memoryview(item.payload)
    flat: Any = _little_endian(item).view(np.uint8)
    return memoryview(flat)


def _pieces(item: Tensorish, chunk_bytes: int) -> Iterator[memoryview]:
    """The bytes of one tensor, ``chunk_bytes`` at a time (at least one piece).

    Each piece is a view, valid only until the next one is asked for: a difference is
    computed into one reused buffer, and raw bytes are views of the tensor. Consumers
    copy a piece (into a message) before they advance.
    """
    if isinstance(item, Difference):
        new, base = _little_endian(item.new), _little_endian(item.base)
        step = max(1, chunk_bytes // base.dtype.itemsize)
        scratch = np.empty(min(step, base.size), dtype=base.dtype)
        for start in range(0, max(base.size, 1), step):
            out = scratch[: min(step, base.size - start)]
            part = slice(start, start + out.size)
            np.subtract(new[part], base[part], out=out, dtype=base.dtype)
            flat: Any = out.view(np.uint8)
            yield memoryview(flat)
        return
    data = _wire_bytes(item)
    for start in range(0, max(len(data), 1), chunk_bytes):
        yield data[start : start + chunk_bytes]


def _describe(
    head: pb.TensorChunk, tail: pb.TensorChunk, name: str, item: Tensorish, total: int
) -> None:
    """The first chunk's announcement: fields before ``data`` in ``head``, after in ``tail``."""
    head.name = name
    head.total_bytes = total
    tail.first = True
    if isinstance(item, EncodedTensor):
        head.dtype = pb.DTYPE_UINT8
        head.shape.append(total)
        tail.encoding.steps.extend(serde.chain_to_proto(item.chain))
        tail.encoding.dtype = serde.dtype_to_proto(item.dtype)
        tail.encoding.shape.extend(item.shape)
        tail.add_to_base = item.add_to_base
    else:
        head.dtype = serde.dtype_to_proto(np.dtype(item.dtype).name)
        head.shape.extend(int(d) for d in item.shape)


def _framed(
    tensors: Mapping[str, Tensorish], chunk_bytes: int
) -> Iterator[tuple[pb.TensorChunk, memoryview, int, pb.TensorChunk]]:
    """Per chunk: its fields before ``data``, the data (a view, see :func:`_pieces`), its
    CRC-32 and its fields after ``crc32``."""
    if chunk_bytes <= 0 or chunk_bytes % 8:
        raise ValueError(f"chunk_bytes must be a positive multiple of 8, got {chunk_bytes}")
    for name, item in tensors.items():
        total = len(item.payload) if isinstance(item, EncodedTensor) else int(item.nbytes)
        offset = 0
        for piece in _pieces(item, chunk_bytes):
            end = offset + piece.nbytes
            head, tail = pb.TensorChunk(offset=offset), pb.TensorChunk(last=end >= total)
            if offset == 0:
                _describe(head, tail, name, item, total)
            yield head, piece, serde.crc32(piece), tail
            offset = end


def iter_chunks(
    tensors: Mapping[str, Tensorish], chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES
) -> Iterator[pb.TensorChunk]:
    """Yield the chunks of every tensor in order; one chunk's copy in memory at a time."""
    for head, piece, crc, tail in _framed(tensors, chunk_bytes):
        head.MergeFrom(tail)
        head.data, head.crc32 = bytes(piece), crc
        yield head


def encode_chunks(
    tensors: Mapping[str, Tensorish], chunk_bytes: int = serde.DEFAULT_CHUNK_BYTES
) -> Iterator[bytes]:
    """Serialized :class:`pb.TensorChunk` messages (for pre-encoded sends).

    The same bytes as serializing :func:`iter_chunks`' messages, with one copy of the
    data per chunk instead of several.
    """
    for head, piece, crc, tail in _framed(tensors, chunk_bytes):
        yield serde.encode_chunk(head, piece, crc, tail)


def encode_upload_chunks(tensors: Mapping[str, Tensorish], chunk_bytes: int) -> Iterator[bytes]:
    """Serialized :class:`pb.UploadMessage` s, one per chunk of ``tensors``."""
    for head, piece, crc, tail in _framed(tensors, chunk_bytes):
        yield serde.encode_chunk(head, piece, crc, tail, upload=True)


def encode_upload(
    header: pb.UploadHeader, tensors: Mapping[str, Tensorish] | None, chunk_bytes: int
) -> Iterator[bytes]:
    """Serialized :class:`pb.UploadMessage` stream: the header, then the tensors' chunks."""
    yield pb.UploadMessage(header=header).SerializeToString()
    yield from encode_upload_chunks(tensors or {}, chunk_bytes)


# ----------------------------------------------------------------- receiving


@dataclass(frozen=True)
class Incoming:
    """What the first chunk of a tensor announced.

    ``spec`` is the decoded tensor's; ``payload`` the bytes on the wire (equal to
    ``spec`` for a raw tensor); ``chain`` is empty for a raw tensor.
    """

    spec: TensorSpec
    payload: TensorSpec
    chain: Chain = ()
    add_to_base: bool = False

    @property
    def encoded(self) -> bool:
        """Whether the bytes are a codec payload."""
        return bool(self.chain)


class TensorSink(Protocol):
    """Where an :class:`Assembler` puts the bytes of each tensor."""

    def begin(self, incoming: Incoming) -> None:
        """A new tensor starts."""

    def write(self, data: bytes | memoryview) -> None:
        """The next piece of the current tensor's bytes (its payload, if encoded).

        A view may be reused after the call returns: copy what is kept.
        """

    def end(self) -> None:
        """The current tensor is complete and checked."""


class ArraySink:
    """Collects tensors into numpy arrays (a client receiving a model).

    Encoded tensors are decoded when complete; differences (``add_to_base``) are
    added to ``base``, the receiver's copy of the version it named.
    """

    def __init__(self, base: WeightsView | None = None) -> None:
        self.weights: dict[str, npt.NDArray[np.generic]] = {}
        self._base = base
        self._incoming: Incoming | None = None
        self._current: npt.NDArray[np.uint8] | None = None
        self._filled = 0

    def begin(self, incoming: Incoming) -> None:
        """Allocate the tensor (or its payload buffer)."""
        if incoming.add_to_base and (self._base is None or incoming.spec.name not in self._base):
            raise ProtocolError(f"difference for {incoming.spec.name!r} without a base tensor")
        target = incoming.payload
        array = np.empty(target.shape, dtype=np.dtype(target.dtype).newbyteorder("<"))
        if not incoming.encoded:
            self.weights[target.name] = array
        self._incoming = incoming
        self._current = array.reshape(-1).view(np.uint8)
        self._filled = 0

    def write(self, data: bytes | memoryview) -> None:
        """Copy a piece into place."""
        if self._current is None:
            raise ProtocolError("tensor data before the tensor's first chunk")
        self._current[self._filled : self._filled + len(data)] = np.frombuffer(data, np.uint8)
        self._filled += len(data)

    def end(self) -> None:
        """Decode (and add to the base) an encoded tensor; raw ones are in place."""
        incoming, payload = self._incoming, self._current
        self._incoming = self._current = None
        if incoming is None or payload is None or not incoming.encoded:
            return
        spec = incoming.spec
        values = decode_tensor(payload.data, incoming.chain, spec.dtype, spec.shape)
        if incoming.add_to_base and self._base is not None:
            values = np.add(self._base[spec.name], values, dtype=spec.dtype)
        self.weights[spec.name] = values


def _announced(chunk: pb.TensorChunk) -> Incoming:
    payload = TensorSpec(chunk.name, serde.dtype_from_proto(chunk.dtype), tuple(chunk.shape))
    if any(d < 0 for d in payload.shape):
        raise ProtocolError(f"tensor {payload.name!r} has a negative dimension {payload.shape}")
    if chunk.total_bytes != payload.nbytes:
        raise ProtocolError(
            f"tensor {payload.name!r}: total_bytes {chunk.total_bytes} != {payload.nbytes}"
        )
    if not chunk.HasField("encoding"):
        if chunk.add_to_base:
            raise ProtocolError(f"tensor {payload.name!r}: add_to_base needs an encoding")
        return Incoming(payload, payload)
    encoding = chunk.encoding
    spec = TensorSpec(chunk.name, serde.dtype_from_proto(encoding.dtype), tuple(encoding.shape))
    if payload.dtype != "uint8" or len(payload.shape) != 1 or any(d < 0 for d in spec.shape):
        raise ProtocolError(f"tensor {spec.name!r}: an encoded payload must be uint8[n]")
    chain = serde.chain_from_proto(encoding.steps)
    if not chain:
        raise ProtocolError(f"tensor {spec.name!r}: an encoding with no codec steps")
    return Incoming(spec, payload, chain, chunk.add_to_base)


class Assembler:
    """Checks a stream of :class:`pb.TensorChunk` and feeds the bytes to a sink.

    The stream's own checks are here: chunk order and offsets, CRC-32, announcements
    that agree with themselves, codec chains against the registry. What each tensor must
    be is a :class:`~geofl.protocols.tensor_checks.TensorCheck`'s: built from
    ``expected``, ``max_total_bytes`` and ``check_finite``, or passed whole as ``check``
    (which then replaces those three), so a receiver that states its rules elsewhere
    applies them to streams and to tensors it holds alike.
    """

    def __init__(
        self,
        sink: TensorSink,
        expected: ModelSpec | None = None,
        *,
        max_total_bytes: int = 1 << 40,
        check_finite: bool = False,
        check: TensorCheck | None = None,
    ) -> None:
        self._sink = sink
        if check is None:
            check = TensorCheck(
                expected, max_total_bytes=max_total_bytes, check_finite=check_finite
            )
        self._check = check
        self._incoming: Incoming | None = None
        self._offset = 0

    @property
    def total_bytes(self) -> int:
        """Decoded bytes of the tensors announced so far."""
        return self._check.total_bytes

    @property
    def payload_bytes(self) -> int:
        """Bytes on the wire of the tensors announced so far."""
        return self._check.payload_bytes

    def feed(self, chunk: pb.TensorChunk, data: bytes | memoryview | None = None) -> None:
        """Take the next chunk; raise a :class:`ProtocolError` subclass on any fault.

        ``data``, when given, is the chunk's data held apart from the message (a view of
        the received bytes, :func:`~geofl.protocols.serde.decode_chunk_view`); the sink
        must copy what it keeps before the next chunk.
        """
        if chunk.first:
            self._begin(chunk)
        incoming = self._incoming
        if incoming is None:
            raise ProtocolError("chunk without a preceding first chunk of its tensor")
        wire = incoming.payload
        if chunk.offset != self._offset:
            raise ProtocolError(
                f"tensor {wire.name!r}: chunk at offset {chunk.offset}, expected {self._offset}"
            )
        if data is None:
            data = chunk.data
        if serde.crc32(data) != chunk.crc32:
            raise ChecksumError(f"tensor {wire.name!r}: checksum mismatch at offset {chunk.offset}")
        end = self._offset + len(data)
        itemsize = np.dtype(wire.dtype).itemsize
        if end > wire.nbytes or (not chunk.last and len(data) % itemsize):
            raise ProtocolError(f"tensor {wire.name!r}: chunk of {len(data)} bytes does not fit")
        self._check.values(wire, data)
        self._sink.write(data)
        self._offset = end
        if chunk.last:
            if end != wire.nbytes:
                raise ProtocolError(f"tensor {wire.name!r}: {end} of {wire.nbytes} bytes sent")
            self._sink.end()
            self._incoming = None

    def _begin(self, chunk: pb.TensorChunk) -> None:
        if self._incoming is not None:
            name = self._incoming.spec.name
            raise ProtocolError(f"tensor {name!r} ended without its last chunk")
        incoming = _announced(chunk)
        self._check.begin(incoming.spec, incoming.payload)
        self._incoming = incoming
        self._offset = 0
        self._sink.begin(incoming)

    def finish(self) -> ModelSpec:
        """Check the stream ended cleanly; return the received (decoded) specification."""
        if self._incoming is not None:
            name = self._incoming.spec.name
            raise TruncatedStreamError(f"stream ended inside tensor {name!r}")
        return self._check.finish()


__all__ = [
    "ArraySink",
    "Assembler",
    "Incoming",
    "TensorSink",
    "encode_chunks",
    "encode_upload",
    "encode_upload_chunks",
    "iter_chunks",
]
