"""Identity and the half-precision casts (fp16, bf16).

NumPy has no bfloat16, so bf16 is computed from the float32 bit pattern: round to
nearest, ties to even, on the upper 16 bits, and stored as uint16.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from geofl.protocols.codecs.base import (
    Array,
    Codec,
    EncodeContext,
    Params,
    Payload,
    PayloadSpec,
    register,
)
from geofl.protocols.codecs.perarray import ArrayCodec, check_parts, contiguous, need
from geofl.protocols.errors import NonFiniteError

#: Smallest float16 magnitude that rounds to infinity (65504 is the largest finite).
FP16_OVERFLOW = 65520.0
#: Smallest float32 magnitude that rounds to infinity in bfloat16 (bits 0x7F7F8000).
BF16_OVERFLOW = float(np.array([0x7F7F8000], dtype=np.uint32).view(np.float32)[0])


def check_range(array: Array, limit: float, codec: str) -> None:
    """Refuse non-finite values and values the target format cannot hold."""
    if array.size == 0:
        return
    low, high = float(array.min()), float(array.max())
    if not (np.isfinite(low) and np.isfinite(high)):
        raise NonFiniteError(f"codec {codec!r}: the tensor holds NaN or Inf values")
    if max(-low, high) >= limit:
        raise ValueError(
            f"codec {codec!r}: |x| = {max(-low, high):.6g} overflows (limit {limit:.6g}); "
            "use bf16 or a quantizer for this tensor"
        )


@register
class Identity(Codec):
    """``none``: the payload passes unchanged (any dtype)."""

    name = "none"
    wire_id = 1
    linear = True

    def encode(self, data: Payload, params: Params, ctx: EncodeContext) -> Payload:
        """Return the payload as it is."""
        return dict(data)

    def decode(self, data: Payload, params: Params, tag: str) -> Payload:
        """Return the payload as it is."""
        return dict(data)

    def estimate(self, spec: PayloadSpec, params: Params, tag: str) -> PayloadSpec:
        """The layout does not change."""
        return dict(spec)


@register
class Float16(ArrayCodec):
    """``fp16``: IEEE half precision (relative error <= 2**-11 in the normal range)."""

    name = "fp16"
    wire_id = 2
    linear = False

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Round to the nearest float16."""
        check_range(array, FP16_OVERFLOW, self.name)
        return {"h": contiguous(array, np.float16)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """Widen to float32 (exact)."""
        check_parts(parts, {"h"}, self.name)
        return need(parts, "h", self.name, "float16").astype(np.float32)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """Two bytes per element."""
        return {"h": ("float16", shape)}


@register
class BFloat16(ArrayCodec):
    """``bf16``: the upper half of float32, rounded to nearest even (rel. error <= 2**-8)."""

    name = "bf16"
    wire_id = 3
    linear = False

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Round the float32 bit pattern to its upper 16 bits, ties to even."""
        check_range(array, BF16_OVERFLOW, self.name)
        bits = contiguous(array, np.float32).view(np.uint32)
        rounded = bits >> 16
        rounded &= 1
        rounded += bits
        rounded += 0x7FFF
        rounded >>= 16
        return {"b": rounded.astype("<u2")}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """Put the 16 bits back on top of a float32 (exact)."""
        check_parts(parts, {"b"}, self.name)
        upper = need(parts, "b", self.name, "uint16").astype(np.uint32)
        upper <<= 16
        return upper.view(np.float32)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """Two bytes per element."""
        return {"b": ("uint16", shape)}
