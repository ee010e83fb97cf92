"""Block-wise uniform quantization (QSGD-style) and scaled sign compression (EF-signSGD).

``qsgd``: each block of ``block`` elements stores one float32 scale ``m`` = max |x|;
values map to the symmetric integer grid ``-s..s`` (``s = 2**(bits-1) - 1``: 127, 7
or 1 levels per side, zero exact), stored as ``q + s`` in ``bits`` bits.  Stochastic
rounding (``floor(y + u)``, ``u ~ U[0, 1)``) makes the decode unbiased; the error is
below one step ``m / s`` (half a step with ``stochastic: false``).
"""

from __future__ import annotations

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
from geofl.protocols.codecs.packing import pack_codes, packed_size, unpack_codes
from geofl.protocols.codecs.perarray import (
    ArrayCodec,
    check_parts,
    contiguous,
    need,
    need_size,
    read_shape,
    shape_part,
)
from geofl.protocols.errors import NonFiniteError
from geofl.protocols.types import Scalar

F32 = npt.NDArray[Any]


def _blocks(array: Array, block: int) -> tuple[F32, int]:
    """``array`` as float32 rows of ``block`` elements (zero-padded) and its size."""
    flat = contiguous(array, np.float32).reshape(-1)
    n = flat.size
    rows = -(-n // block)
    if rows * block == n:
        return flat.reshape(rows, block), n
    padded = np.zeros(rows * block, dtype=np.float32)
    padded[:n] = flat
    return padded.reshape(rows, block), n


def _checked_scales(scales: F32, codec: str) -> F32:
    """Scales must be finite and non-negative, on both sides of the wire."""
    if not np.isfinite(scales).all():
        raise NonFiniteError(f"codec {codec!r}: the tensor holds NaN or Inf values")
    return scales


def _decoded_scales(parts: Mapping[str, Array], rows: int, codec: str) -> F32:
    scales = need_size(need(parts, "scale", codec, "float32"), rows, codec, "scale")
    if not (np.isfinite(scales).all() and (scales >= 0).all()):
        raise CodecError(f"codec {codec!r}: scales must be finite and >= 0 (NaN/Inf/negative)")
    return scales.astype(np.float32)


@register
class QSGD(ArrayCodec):
    """``qsgd``: per-block max-abs scale, ``bits`` ∈ {8, 4, 2}, stochastic or nearest rounding."""

    name = "qsgd"
    wire_id = 4
    linear = True
    params_spec: ClassVar[Mapping[str, Param]] = {
        "bits": Param(int, 8, choices=(8, 4, 2)),
        "block": Param(int, 512, low=8, high=1 << 20),
        "stochastic": Param(bool, True),
    }

    def check_combination(self, params: dict[str, Scalar]) -> None:
        """Blocks must be whole bytes of codes."""
        if int(params["block"]) % 8:
            raise CodecError(
                f"codec 'qsgd': parameter 'block' must be a multiple of 8, got {params['block']!r}"
            )

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Quantize ``array`` block by block (see the module docstring)."""
        bits, block = int(params["bits"]), int(params["block"])
        levels = (1 << (bits - 1)) - 1
        rows, n = _blocks(array, block)
        scales = _checked_scales(
            np.maximum(rows.max(axis=1, initial=0), -rows.min(axis=1, initial=0)), self.name
        )
        # Divide by m (not multiply by s / m): s / m overflows float32 for tiny blocks.
        scaled = rows / np.where(scales > 0, scales, np.float32(1))[:, None]
        scaled *= np.float32(levels)
        if params["stochastic"]:
            scaled += ctx.rng.random(scaled.shape, dtype=np.float32)
            scaled += np.float32(levels)
        else:
            scaled += np.float32(levels + 0.5)
        codes = scaled.astype(np.uint8).reshape(-1)[:n]
        np.minimum(codes, np.uint8(2 * levels), out=codes)
        return {"q": pack_codes(codes, bits), "scale": scales, "shape": shape_part(array.shape)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """``(q - s) * m / s`` per block."""
        check_parts(parts, {"q", "scale", "shape"}, self.name)
        bits, block = int(params["bits"]), int(params["block"])
        levels = (1 << (bits - 1)) - 1
        shape = read_shape(parts, self.name)
        n = int(np.prod(shape, dtype=np.int64))
        rows = -(-n // block)
        scales = _decoded_scales(parts, rows, self.name)
        codes = unpack_codes(need(parts, "q", self.name, "uint8").reshape(-1), bits, n)
        if n and int(codes.max()) > 2 * levels:
            raise CodecError(f"codec 'qsgd': code {int(codes.max())} exceeds {2 * levels}")
        if rows * block != n:
            codes = np.concatenate([codes, np.full(rows * block - n, levels, dtype=np.uint8)])
        values = codes.reshape(rows, block).astype(np.float32)
        values -= np.float32(levels)
        values *= np.float32(1 / levels)
        values *= scales[:, None]
        return values.reshape(-1)[:n].reshape(shape)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """``bits`` per element plus one float32 per block."""
        n = int(np.prod(shape, dtype=np.int64))
        bits, block = int(params["bits"]), int(params["block"])
        return {
            "q": ("uint8", (packed_size(n, bits),)),
            "scale": ("float32", (-(-n // block),)),
            "shape": ("uint64", (len(shape),)),
        }


@register
class Sign(ArrayCodec):
    """``sign``: one bit per element (1 = negative) and scale mean |x| per block.

    ``block: 0`` means one scale for the whole tensor.  Zero is sent as positive.
    """

    name = "sign"
    wire_id = 8
    linear = False
    params_spec: ClassVar[Mapping[str, Param]] = {"block": Param(int, 0, low=0, high=1 << 30)}

    def check_combination(self, params: dict[str, Scalar]) -> None:
        """Blocks must be whole bytes of sign bits."""
        if int(params["block"]) % 8:
            raise CodecError(
                f"codec 'sign': parameter 'block' must be 0 or a multiple of 8, "
                f"got {params['block']!r}"
            )

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """Sign bits packed 8 per byte, little bit order, and the block scales."""
        n = int(array.size)
        block = int(params["block"]) or max(n, 1)
        rows, _ = _blocks(array, block)
        scales = np.abs(rows).sum(axis=1, dtype=np.float64)
        counts = np.full(rows.shape[0], block, dtype=np.float64)
        if counts.size:
            counts[-1] = n - block * (rows.shape[0] - 1)
        scales = _checked_scales((scales / counts).astype(np.float32), self.name)
        negative = rows.reshape(-1)[:n] < 0
        bits = np.packbits(negative, bitorder="little")
        return {"s": bits, "scale": scales, "shape": shape_part(array.shape)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """``scale * (1 - 2 * bit)`` per element."""
        check_parts(parts, {"s", "scale", "shape"}, self.name)
        shape = read_shape(parts, self.name)
        n = int(np.prod(shape, dtype=np.int64))
        block = int(params["block"]) or max(n, 1)
        rows = -(-n // block)
        scales = _decoded_scales(parts, rows, self.name)
        negative = unpack_codes(need(parts, "s", self.name, "uint8").reshape(-1), 1, n)
        signs = np.float32(1) - np.float32(2) * negative.astype(np.float32)
        per_element = np.repeat(scales, block)[:n] if rows > 1 else scales[:1]
        return (signs * per_element).reshape(shape) if n else np.zeros(shape, np.float32)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """One bit per element plus one float32 per block."""
        n = int(np.prod(shape, dtype=np.int64))
        block = int(params["block"]) or max(n, 1)
        return {
            "s": ("uint8", (packed_size(n, 1),)),
            "scale": ("float32", (-(-n // block),)),
            "shape": ("uint64", (len(shape),)),
        }
