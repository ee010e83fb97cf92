"""Sparsification: top-k by magnitude and random-k from a seed.

``topk`` keeps the ``k`` entries of largest ``|x|`` (ties broken by lower index, so
the choice is deterministic) and sends their sorted indices in the smallest of three
encodings (:func:`~geofl.protocols.codecs.packing.encode_indices`).  ``randk`` sends
only a 64-bit seed: the receiver regenerates the same index set.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from geofl.protocols.codecs.base import (
    Array,
    CodecError,
    EncodeContext,
    Param,
    Params,
    Payload,
    PayloadSpec,
    register,
)
from geofl.protocols.codecs.packing import (
    BITMAP,
    GAP,
    VARINT_GAP,
    decode_indices,
    encode_indices,
    smallest_width,
)
from geofl.protocols.codecs.perarray import (
    ArrayCodec,
    check_parts,
    contiguous,
    is_float,
    need,
    need_size,
    read_shape,
    shape_part,
)
from geofl.protocols.errors import NonFiniteError
from geofl.protocols.types import Scalar

I64 = npt.NDArray[Any]
_SIZE_PARAMS = {
    "ratio": Param(float, None, low=0.0, high=1.0),
    "k": Param(int, None, low=1, high=1 << 40),
}


def kept_count(n: int, params: Params) -> int:
    """How many of ``n`` elements a sparsifier keeps: ``k``, or ``ceil(ratio * n)`` >= 1."""
    if n == 0:
        return 0
    if "k" in params:
        return min(int(params["k"]), n)
    wanted = math.ceil(round(float(params["ratio"]) * n, 6))
    return min(n, max(1, wanted))


def _check_size_params(codec: str, params: dict[str, Scalar]) -> None:
    if ("ratio" in params) == ("k" in params):
        raise CodecError(f"codec {codec!r}: give exactly one of 'ratio' (0 < ratio <= 1) or 'k'")
    if "ratio" in params and float(params["ratio"]) <= 0:
        raise CodecError(f"codec {codec!r}: parameter 'ratio' must be > 0, got {params['ratio']!r}")


def top_indices(flat: Array, k: int) -> I64:
    """Sorted indices of the ``k`` largest ``|flat|``; ties go to lower indices."""
    n = flat.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    magnitude = np.abs(flat)
    ordered = np.partition(magnitude, n - k)
    if not np.isfinite(ordered[n - k :]).all():
        raise NonFiniteError("codec 'topk': the tensor holds NaN or Inf values")
    threshold = ordered[n - k]
    keep = magnitude > threshold
    ties = np.flatnonzero(magnitude == threshold)[: k - int(np.count_nonzero(keep))]
    keep[ties] = True
    return np.flatnonzero(keep).astype(np.int64)


def random_indices(seed: int, n: int, k: int) -> I64:
    """The ``k``-subset of ``range(n)`` drawn from ``seed``, sorted.

    Position ``i`` gets key ``draw_i`` (the i-th raw 64-bit output of
    ``PCG64(SeedSequence(seed))``) with its low ``bit_length(n - 1)`` bits replaced by
    ``i``, making keys distinct; the ``k`` smallest keys win.  PCG64 and SeedSequence
    are fixed algorithms, so any NumPy regenerates the same set.
    """
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    raw = np.random.PCG64(seed).random_raw(n)
    shift = np.uint64(max(1, (n - 1).bit_length()))
    keys = (raw >> shift) << shift
    keys |= np.arange(n, dtype=np.uint64)
    threshold = np.partition(keys, k - 1)[k - 1]
    return np.flatnonzero(keys <= threshold).astype(np.int64)


def _scatter(values: Array, indices: I64, shape: tuple[int, ...], scale: float) -> Array:
    work = np.float64 if values.dtype == np.float64 else np.float32
    out = np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=work)
    out[indices] = np.multiply(values, scale, dtype=work) if scale != 1.0 else values
    return out.reshape(shape)


def _values(parts: Mapping[str, Array], count_from: int | None, codec: str) -> Array:
    values = need(parts, "val", codec)
    if not is_float(values.dtype) or values.ndim != 1:
        raise CodecError(f"codec {codec!r}: part 'val' must be a float vector, got {values.dtype}")
    return values if count_from is None else need_size(values, count_from, codec, "val")


@register
class TopK(ArrayCodec):
    """``topk``: the ``k`` (or ``ratio * n``) largest-magnitude entries and their indices."""

    name = "topk"
    wire_id = 5
    linear = False
    reshapes = True
    params_spec = _SIZE_PARAMS

    def check_combination(self, params: dict[str, Scalar]) -> None:
        """Exactly one of ``ratio`` and ``k``."""
        _check_size_params(self.name, params)

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Values at the kept indices, and the indices in their most compact scheme."""
        flat = contiguous(array, array.dtype).reshape(-1)
        indices = top_indices(flat, kept_count(flat.size, params))
        scheme, encoded = encode_indices(indices, flat.size)
        return {"val": flat[indices], scheme: encoded, "shape": shape_part(array.shape)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """Scatter the values into zeros; indices must be in range."""
        check_parts(parts, {"val", "shape", GAP, VARINT_GAP, BITMAP}, self.name)
        shape = read_shape(parts, self.name)
        n = int(np.prod(shape, dtype=np.int64))
        schemes = [name for name in (GAP, VARINT_GAP, BITMAP) if name in parts]
        if len(schemes) != 1:
            raise CodecError(f"codec 'topk': expected one index part, got {schemes}")
        values = _values(parts, None, self.name)
        indices = decode_indices(schemes[0], parts[schemes[0]], values.size, n)
        return _scatter(values, indices, shape, 1.0)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """Upper bound: the smaller of worst-case fixed-width gaps and the bitmap."""
        n = int(np.prod(shape, dtype=np.int64))
        k = kept_count(n, params)
        width = smallest_width(max(n - k, 0))
        bitmap = -(-n // 8)
        index = (GAP, str(width), k) if k * width.itemsize <= bitmap else (BITMAP, "uint8", bitmap)
        return {
            "val": (dtype, (k,)),
            index[0]: (np.dtype(index[1]).name, (index[2],)),
            "shape": ("uint64", (len(shape),)),
        }


@register
class RandK(ArrayCodec):
    """``randk``: ``k`` uniformly random entries; only the 64-bit index seed travels.

    With ``unbiased: true`` the decode scales values by ``n / k`` so that its
    expectation over seeds is the input.
    """

    name = "randk"
    wire_id = 6
    linear = True
    reshapes = True
    params_spec: ClassVar[Mapping[str, Param]] = {**_SIZE_PARAMS, "unbiased": Param(bool, False)}

    def check_combination(self, params: dict[str, Scalar]) -> None:
        """Exactly one of ``ratio`` and ``k``."""
        _check_size_params(self.name, params)

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Values at the seed's index set, and the seed."""
        flat = contiguous(array, array.dtype).reshape(-1)
        seed = int(ctx.rng.integers(0, 1 << 63))
        values = flat[random_indices(seed, flat.size, kept_count(flat.size, params))]
        if not np.isfinite(values).all():
            raise NonFiniteError("codec 'randk': the tensor holds NaN or Inf values")
        seed_part = np.array([seed], dtype="<u8")
        return {"val": values, "seed": seed_part, "shape": shape_part(array.shape)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """Regenerate the index set from the seed and scatter the values."""
        check_parts(parts, {"val", "seed", "shape"}, self.name)
        shape = read_shape(parts, self.name)
        n = int(np.prod(shape, dtype=np.int64))
        k = kept_count(n, params)
        seed = int(need_size(need(parts, "seed", self.name, "uint64"), 1, self.name, "seed")[0])
        values = _values(parts, k, self.name)
        scale = n / k if params["unbiased"] and k else 1.0
        return _scatter(values, random_indices(seed, n, k), shape, scale)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """``k`` values and one seed."""
        k = kept_count(int(np.prod(shape, dtype=np.int64)), params)
        return {
            "val": (dtype, (k,)),
            "seed": ("uint64", (1,)),
            "shape": ("uint64", (len(shape),)),
        }
