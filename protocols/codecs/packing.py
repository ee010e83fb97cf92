"""Bit packing, LEB128 varints and compact encodings of sorted index sets.

All vectorized: loops run over bit positions or varint byte positions (at most 10),
never over elements.  Decoders validate everything and raise :class:`CodecError`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.base import CodecError

U8 = npt.NDArray[Any]
U64 = npt.NDArray[Any]
I64 = npt.NDArray[Any]

#: Index schemes of a sorted index set, as payload part names.
GAP, VARINT_GAP, BITMAP = "gap", "vgap", "bmp"
_WIDTHS = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))
_MAX_VARINT_BYTES = 10


def packed_size(count: int, bits: int) -> int:
    """Bytes holding ``count`` codes of ``bits`` bits (1, 2, 4 or 8)."""
    return -(-count * bits // 8)


def pack_codes(codes: U8, bits: int) -> U8:
    """Pack ``bits``-bit codes, first code in the lowest bits of the first byte."""
    if bits == 8:
        return codes
    per = 8 // bits
    padded = -(-codes.size // per) * per
    if padded != codes.size:
        codes = np.concatenate([codes, np.zeros(padded - codes.size, dtype=np.uint8)])
    columns = codes.reshape(-1, per)
    out = columns[:, 0].copy()
    for j in range(1, per):
        out |= columns[:, j] << np.uint8(bits * j)
    return out


def unpack_codes(packed: U8, bits: int, count: int) -> U8:
    """Inverse of :func:`pack_codes`; the padding bits must be zero."""
    if packed.size != packed_size(count, bits):
        raise CodecError(
            f"packed codes hold {packed.size} bytes, expected {packed_size(count, bits)} "
            f"for {count} codes of {bits} bits"
        )
    if bits == 8:
        return packed.reshape(count)
    per = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out = np.empty((packed.size, per), dtype=np.uint8)
    for j in range(per):
        np.bitwise_and(packed >> np.uint8(bits * j), mask, out=out[:, j])
    flat = out.reshape(-1)
    if flat[count:].any():
        raise CodecError("packed codes have non-zero padding bits")
    return flat[:count]


def varint_lengths(values: U64) -> npt.NDArray[np.intp]:
    """Bytes each value takes as an LEB128 varint."""
    lengths = np.ones(values.size, dtype=np.intp)
    for j in range(1, _MAX_VARINT_BYTES):
        lengths += values >= np.uint64(1 << (7 * j))
    return lengths


def varint_encode(values: U64) -> U8:
    """LEB128: 7 bits per byte, low bits first, high bit set on all but the last byte."""
    lengths = varint_lengths(values)
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for j in range(int(lengths.max(initial=0))):
        sel = lengths > j
        low7 = ((values[sel] >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8)
        more = (lengths[sel] > j + 1).astype(np.uint8) << np.uint8(7)
        out[starts[sel] + j] = low7 | more
    return out


def varint_decode(data: U8, count: int) -> U64:
    """Exactly ``count`` canonical varints filling ``data``; :class:`CodecError` otherwise."""
    ends = np.flatnonzero(data < 0x80)
    if ends.size != count or (count and ends[-1] != data.size - 1) or (not count and data.size):
        raise CodecError(f"varint data of {data.size} bytes does not hold exactly {count} values")
    starts = np.concatenate([np.zeros(min(count, 1), dtype=np.intp), ends[:-1] + 1])
    lengths = ends - starts + 1
    if lengths.max(initial=1) > _MAX_VARINT_BYTES or (
        count and (data[ends[lengths > 1]] == 0).any()
    ):
        raise CodecError("varint data holds an overlong or non-canonical value")
    if (lengths == _MAX_VARINT_BYTES).any() and (
        data[ends[lengths == _MAX_VARINT_BYTES]] > 1
    ).any():
        raise CodecError("varint value overflows 64 bits")
    values = np.zeros(count, dtype=np.uint64)
    for j in range(int(lengths.max(initial=0))):
        sel = lengths > j
        chunk = (data[starts[sel] + j] & np.uint8(0x7F)).astype(np.uint64)
        values[sel] |= chunk << np.uint64(7 * j)
    return values


def smallest_width(max_value: int) -> np.dtype[Any]:
    """The narrowest little-endian unsigned dtype holding ``max_value``."""
    return next(w for w in _WIDTHS if max_value <= np.iinfo(w).max)


def encode_indices(indices: I64, n: int) -> tuple[str, U8]:
    """The smallest of three encodings of strictly increasing ``indices`` in ``[0, n)``.

    ``gap``: gaps minus one (``i[0]``, ``i[j] - i[j-1] - 1``) in the narrowest fixed
    width; ``vgap``: the same gaps as varints; ``bmp``: one bit per position.  Ties go
    to the first.  Gaps minus one make any decoded set strictly increasing.
    """
    gaps = np.diff(indices, prepend=-1).astype(np.uint64) - np.uint64(1)
    width = smallest_width(int(gaps.max(initial=0)))
    sizes = {
        GAP: indices.size * width.itemsize,
        VARINT_GAP: int(varint_lengths(gaps).sum()),
        BITMAP: -(-n // 8),
    }
    scheme = min(sizes, key=lambda name: (sizes[name], list(sizes).index(name)))
    if scheme == GAP:
        return GAP, gaps.astype(width)
    if scheme == VARINT_GAP:
        return VARINT_GAP, varint_encode(gaps)
    bits = np.zeros(n, dtype=np.bool_)
    bits[indices] = True
    return BITMAP, np.packbits(bits, bitorder="little")


def decode_indices(scheme: str, data: U8, count: int, n: int) -> I64:
    """Indices from :func:`encode_indices`, checking count and range ``[0, n)``."""
    if count > n:
        raise CodecError(f"{count} indices cannot be distinct in a tensor of {n} elements")
    if scheme == BITMAP:
        return _decode_bitmap(data, count, n)
    if scheme == VARINT_GAP:
        if data.dtype != np.uint8:
            raise CodecError(f"varint index data must be uint8, got {data.dtype}")
        gaps = varint_decode(data.reshape(-1), count)
    elif scheme == GAP:
        if data.dtype not in _WIDTHS or data.size != count:
            raise CodecError(f"gap index data must be {count} unsigned ints, got {data.dtype}")
        gaps = data.reshape(-1).astype(np.uint64)
    else:
        raise CodecError(f"unknown index scheme {scheme!r}")
    if count and float(gaps.astype(np.float64).sum()) + count > n + 1:
        raise CodecError(f"indices run past the tensor's {n} elements")
    indices = np.cumsum(gaps.astype(np.int64) + 1) - 1
    if count and indices[-1] >= n:
        raise CodecError(f"index {int(indices[-1])} out of range for {n} elements")
    return indices


def _decode_bitmap(data: U8, count: int, n: int) -> I64:
    if data.dtype != np.uint8 or data.size != -(-n // 8):
        raise CodecError(f"index bitmap must be {-(-n // 8)} bytes, got {data.size} {data.dtype}")
    bits = np.unpackbits(data.reshape(-1), bitorder="little")
    if bits[n:].any():
        raise CodecError("index bitmap has bits set past the tensor's end")
    indices = np.flatnonzero(bits[:n]).astype(np.int64)
    if indices.size != count:
        raise CodecError(f"index bitmap selects {indices.size} positions, expected {count}")
    return indices
