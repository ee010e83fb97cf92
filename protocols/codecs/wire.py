"""The byte format of a compressed tensor, and the chain driver.

Layout (all little-endian)::

    magic   4 bytes  b"GFC" + format version (1)
    steps   u8 count, then one u8 wire id per chain step, in encode order
    arrays  u16 count, then per array:
              u8 name length, name (ASCII), u8 dtype code, u8 ndim, u64 per dim
    data    each array's raw bytes, in header order, no padding

The decoder checks every field and that the data fill the payload exactly, so a
truncated, padded or corrupted payload raises :class:`CodecError`; nothing is pickled.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.base import (
    Array,
    Chain,
    CodecError,
    CodecState,
    EncodeContext,
    Payload,
    PayloadSpec,
    check_chain,
)
from geofl.protocols.codecs.perarray import MAX_ELEMENTS, MAX_NDIM, is_float

MAGIC = b"GFC\x01"
MAX_ARRAYS = 4096
DTYPE_CODES: dict[str, int] = {
    "float16": 1,
    "float32": 2,
    "float64": 3,
    "uint8": 4,
    "uint16": 5,
    "uint32": 6,
    "uint64": 7,
    "int8": 8,
    "int16": 9,
    "int32": 10,
    "int64": 11,
    "bool": 12,
}
_DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


def step_tag(index: int) -> str:
    """The tag that names the payload parts of chain step ``index``."""
    return f"s{index}"


def _le(array: Array) -> Array:
    """``array`` C-contiguous and little-endian."""
    wanted = array.dtype.newbyteorder("<")
    if array.dtype != wanted:
        array = array.astype(wanted)
    return array if array.flags.c_contiguous else np.array(array, order="C")


def _header(wire_ids: Sequence[int], spec: PayloadSpec) -> bytes:
    parts = [MAGIC, struct.pack("<B", len(wire_ids)), bytes(wire_ids)]
    parts.append(struct.pack("<H", len(spec)))
    for name, (dtype, shape) in spec.items():
        encoded = name.encode("ascii")
        if dtype not in DTYPE_CODES or len(encoded) > 255 or len(shape) > MAX_NDIM:
            raise CodecError(f"array {name!r} ({dtype}, {len(shape)} dims) cannot be framed")
        parts.append(struct.pack("<B", len(encoded)) + encoded)
        parts.append(struct.pack(f"<BB{len(shape)}Q", DTYPE_CODES[dtype], len(shape), *shape))
    return b"".join(parts)


def serialize(wire_ids: Sequence[int], payload: Payload) -> bytes:
    """Frame ``payload`` (see the module docstring)."""
    arrays = [_le(array) for array in payload.values()]
    spec = {name: (a.dtype.name, a.shape) for name, a in zip(payload, arrays, strict=True)}
    chunks: list[bytes | memoryview] = [_header(wire_ids, spec)]
    chunks.extend(a.reshape(-1).view(np.uint8).data for a in arrays if a.size)
    return b"".join(chunks)


def framed_size(wire_ids: Sequence[int], spec: PayloadSpec) -> int:
    """Bytes that :func:`serialize` produces for a payload laid out as ``spec``."""
    data = sum(
        int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        for dtype, shape in spec.values()
    )
    return len(_header(wire_ids, spec)) + data


class _Reader:
    """Bounds-checked reading of the header."""

    def __init__(self, raw: memoryview) -> None:
        self.raw = raw
        self.offset = 0

    def take(self, fmt: str) -> tuple[int, ...]:
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.raw):
            raise CodecError(f"compressed payload truncated in its header at byte {self.offset}")
        values = struct.unpack_from(fmt, self.raw, self.offset)
        self.offset += size
        return tuple(int(v) for v in values)

    def name(self) -> str:
        (length,) = self.take("<B")
        raw = bytes(self.raw[self.offset : self.offset + length])
        self.take(f"<{length}x")
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise CodecError("compressed payload has a non-ASCII array name") from None


def _array_layout(reader: _Reader) -> tuple[str, str, tuple[int, ...]]:
    name = reader.name()
    code, ndim = reader.take("<BB")
    if code not in _DTYPE_NAMES:
        raise CodecError(f"array {name!r} has unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise CodecError(f"array {name!r} has {ndim} dims, more than {MAX_NDIM}")
    shape = reader.take(f"<{ndim}Q")
    if int(np.prod(np.array(shape, dtype=np.float64))) > MAX_ELEMENTS:
        raise CodecError(f"array {name!r} of shape {shape} is too large")
    return name, _DTYPE_NAMES[code], shape


def parse(payload: bytes | bytearray | memoryview) -> tuple[tuple[int, ...], Payload]:
    """Wire ids and arrays (read-only views into ``payload``); :class:`CodecError` if bad."""
    raw = memoryview(payload).cast("B")
    reader = _Reader(raw)
    if bytes(raw[:4]) != MAGIC:
        raise CodecError(f"not a geofl compressed payload (magic {bytes(raw[:4])!r})")
    reader.offset = 4
    (steps,) = reader.take("<B")
    wire_ids = reader.take(f"<{steps}B")
    (count,) = reader.take("<H")
    if count > MAX_ARRAYS:
        raise CodecError(f"compressed payload claims {count} arrays (limit {MAX_ARRAYS})")
    layouts = [_array_layout(reader) for _ in range(count)]
    offset, arrays = reader.offset, {}
    for name, dtype, shape in layouts:
        if name in arrays:
            raise CodecError(f"compressed payload names array {name!r} twice")
        items = int(np.prod(shape, dtype=np.int64))
        size = items * np.dtype(dtype).itemsize
        if offset + size > len(raw):
            raise CodecError(
                f"compressed payload truncated: array {name!r} needs bytes "
                f"{offset}..{offset + size}, payload has {len(raw)}"
            )
        array = np.frombuffer(raw, np.dtype(dtype).newbyteorder("<"), items, offset)
        arrays[name] = array.reshape(shape)
        offset += size
    if offset != len(raw):
        raise CodecError(f"compressed payload has {len(raw) - offset} bytes after its data")
    return wire_ids, arrays


def run_encode(array: npt.ArrayLike, chain: Chain, seed: int, state: CodecState | None) -> bytes:
    """Apply the chain's steps in order; each step draws from its own generator."""
    check_chain(chain)
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"seed must be in 0..2**64-1, got {seed}")
    tensor = _le(np.asarray(array))
    if tensor.dtype.name not in DTYPE_CODES:
        raise ValueError(f"dtype {tensor.dtype} cannot be compressed")
    payload: Payload = {"x": tensor}
    for index, step in enumerate(chain):
        ctx = EncodeContext(np.random.default_rng([seed, index]), state, step_tag(index))
        payload = step.codec.encode(payload, step.params, ctx)
    return serialize([step.codec.wire_id for step in chain], payload)


def _check_claimed_sizes(data: Payload, limit: int) -> None:
    """No step may claim to rebuild more elements than the final tensor holds.

    Intermediate arrays (kept values, low-rank factors) are never larger than the
    tensor, so this bounds the memory a hostile payload can make the decoder allocate.
    """
    for name, array in data.items():
        if name.endswith(".shape") and array.dtype == np.uint64 and array.ndim == 1:
            claimed = float(np.prod(array.astype(np.float64)))
            if claimed > limit:
                raise CodecError(
                    f"payload part {name!r} claims {claimed:.0f} elements, "
                    f"more than the tensor's {limit}"
                )


def run_decode(
    payload: bytes | bytearray | memoryview, chain: Chain, limit: int = MAX_ELEMENTS
) -> Array:
    """Parse, check the chain, apply the steps backwards; the single array left."""
    check_chain(chain)
    wire_ids, data = parse(payload)
    _check_claimed_sizes(data, limit)
    expected = tuple(step.codec.wire_id for step in chain)
    if wire_ids != expected:
        raise CodecError(
            f"payload was encoded with codec ids {list(wire_ids)}, "
            f"expected {list(expected)} ({[s.name for s in chain]})"
        )
    with np.errstate(over="ignore", invalid="ignore"):  # caught by finish()
        for index in reversed(range(len(chain))):
            step = chain[index]
            data = step.codec.decode(data, step.params, step_tag(index))
    if list(data) != ["x"]:
        raise CodecError(f"payload decodes to arrays {sorted(data)}, expected only 'x'")
    return data["x"]


def finish(array: Array, dtype: str, shape: tuple[int, ...]) -> Array:
    """``array`` as a fresh writable array of ``dtype`` and ``shape``."""
    if dtype not in DTYPE_CODES:
        raise CodecError(f"dtype {dtype!r} cannot be decompressed")
    size = int(np.prod(shape, dtype=np.int64))
    if array.size != size:
        raise CodecError(f"payload holds {array.size} elements, expected {size} for {shape}")
    if array.dtype.name != dtype and not (is_float(dtype) and is_float(array.dtype)):
        raise CodecError(f"payload holds {array.dtype} values, expected {dtype}")
    if is_float(array.dtype) and not np.isfinite(array).all():
        raise CodecError("payload decodes to NaN or Inf values")
    with np.errstate(over="ignore"):
        result = array.astype(dtype).reshape(shape)
    narrowed = is_float(dtype) and array.dtype.itemsize > result.dtype.itemsize
    if narrowed and not np.isfinite(result).all():
        raise CodecError(f"payload decodes to values that overflow {dtype}")
    return result
