"""Codecs that act on each floating-point array of a payload independently.

Every concrete codec is one of these: it turns one float array into named parts
(``{"q": ..., "scale": ...}``) and back.  The parts travel as ``<key>.<tag>.<part>``;
non-float arrays (indices, packed codes of an earlier step) pass through untouched.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.base import (
    Array,
    Codec,
    CodecError,
    EncodeContext,
    Params,
    Payload,
    PayloadSpec,
)

#: Decoders refuse shapes with more elements than this (2**40, about 4 TiB of float32).
MAX_ELEMENTS = 1 << 40
MAX_NDIM = 32
SHAPE_DTYPE = "uint64"


def is_float(dtype: np.dtype[np.generic] | str) -> bool:
    """Whether arrays of ``dtype`` are inputs of the value codecs."""
    return np.dtype(dtype).kind == "f"


def contiguous(array: Array, dtype: npt.DTypeLike) -> Array:
    """``array`` as a C-contiguous array of ``dtype`` (0-d arrays stay 0-d)."""
    out = np.asarray(array, dtype=dtype)
    return out if out.flags.c_contiguous else np.array(out, order="C")


def part_name(key: str, tag: str, part: str) -> str:
    """The payload name of ``part`` produced from ``key`` by the step tagged ``tag``."""
    return f"{key}.{tag}.{part}"


def shape_part(shape: tuple[int, ...]) -> Array:
    """The ``shape`` part: the input array's shape as little-endian uint64."""
    return np.asarray(shape, dtype="<u8").reshape(len(shape))


def read_shape(parts: Mapping[str, Array], codec: str) -> tuple[int, ...]:
    """The validated shape stored in ``parts["shape"]``."""
    raw = need(parts, "shape", codec, SHAPE_DTYPE)
    if raw.ndim != 1 or raw.size > MAX_NDIM:
        raise CodecError(f"codec {codec!r}: shape part must be a vector of <= {MAX_NDIM} dims")
    shape = tuple(int(d) for d in raw)
    total = 1
    for dim in shape:
        total *= dim
        if total > MAX_ELEMENTS:
            raise CodecError(f"codec {codec!r}: shape {shape} exceeds {MAX_ELEMENTS} elements")
    return shape


def need(parts: Mapping[str, Array], part: str, codec: str, dtype: str | None = None) -> Array:
    """``parts[part]``, checking presence and dtype, else :class:`CodecError`."""
    if part not in parts:
        raise CodecError(f"codec {codec!r}: payload lacks part {part!r} (has {sorted(parts)})")
    array = parts[part]
    if dtype is not None and array.dtype != np.dtype(dtype):
        raise CodecError(f"codec {codec!r}: part {part!r} must be {dtype}, got {array.dtype}")
    return array


def need_size(array: Array, size: int, codec: str, part: str) -> Array:
    """``array`` flattened, checking that it holds exactly ``size`` elements."""
    if array.size != size:
        raise CodecError(
            f"codec {codec!r}: part {part!r} has {array.size} elements, expected {size}"
        )
    return array.reshape(size)


class ArrayCodec(Codec):
    """A codec defined by what it does to one float array."""

    @abstractmethod
    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """The parts that represent ``array``."""

    @abstractmethod
    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """The array represented by ``parts``; :class:`CodecError` if malformed."""

    @abstractmethod
    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """Dtypes and shapes of the parts for an input of ``dtype`` and ``shape``."""

    def encode(self, data: Payload, params: Params, ctx: EncodeContext) -> Payload:
        """Encode each float array of ``data``; keep the others as they are."""
        out: Payload = {}
        for key, array in data.items():
            if not is_float(array.dtype):
                out[key] = array
                continue
            for part, value in self.encode_array(array, params, ctx, key).items():
                out[part_name(key, ctx.tag, part)] = value
        return out

    def decode(self, data: Payload, params: Params, tag: str) -> Payload:
        """Rebuild each array whose parts carry ``tag``, at the position of its first part."""
        groups: dict[str, dict[str, Array]] = {}
        order: list[tuple[str, bool]] = []
        for name, array in data.items():
            pieces = name.rsplit(".", 2)
            if len(pieces) == 3 and pieces[1] == tag:
                base, _, part = pieces
                if base not in groups:
                    groups[base] = {}
                    order.append((base, True))
                groups[base][part] = array
            else:
                order.append((name, False))
        out: Payload = {}
        for name, decoded in order:
            if name in out:
                raise CodecError(f"codec {self.name!r}: payload name {name!r} appears twice")
            out[name] = self.decode_array(groups[name], params) if decoded else data[name]
        return out

    def estimate(self, spec: PayloadSpec, params: Params, tag: str) -> PayloadSpec:
        """The layout after encoding each float array of ``spec``."""
        out: PayloadSpec = {}
        for key, (dtype, shape) in spec.items():
            if not is_float(dtype):
                out[key] = (dtype, shape)
                continue
            for part, layout in self.estimate_array(dtype, shape, params).items():
                out[part_name(key, tag, part)] = layout
        return out


def check_parts(parts: Mapping[str, Array], allowed: set[str], codec: str) -> None:
    """Reject parts that this codec never writes."""
    extra = sorted(set(parts) - allowed)
    if extra:
        raise CodecError(f"codec {codec!r}: unexpected part {extra[0]!r} in payload")
