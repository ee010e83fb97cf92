"""Low-rank factorization with one warm-started power iteration (PowerSGD).

A tensor with two or more dimensions is viewed as the matrix ``M`` of shape
``(shape[0], prod(shape[1:]))`` (a conv kernel ``(out, in, kh, kw)`` becomes
``(out, in*kh*kw)``).  With ``Q`` the factor kept from the previous round (random at
first), one step computes ``P = orth(M Q)`` (reduced QR) and ``Q = M^T P`` and sends
both; the receiver decodes ``P Q^T``.  Repeated on a slowly changing ``M``, this is
subspace iteration: it tracks the best rank-``r`` approximation, and it is exact at
once for a matrix of rank <= ``r``.

State (the caller's per-tensor ``state`` dict): key ``"<key>.<tag>.q"`` holds the
float32 ``(m, r)`` factor ``Q`` of the last encode.  Without state each encode starts
from a fresh Gaussian ``Q`` drawn from the step's generator.  Vectors, empty tensors and
tensors that a rank-``r`` pair would not shrink travel raw (part ``raw``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

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
from geofl.protocols.codecs.perarray import (
    ArrayCodec,
    check_parts,
    contiguous,
    need,
    read_shape,
    shape_part,
)
from geofl.protocols.errors import NonFiniteError


def matrix_dims(shape: tuple[int, ...], rank: int) -> tuple[int, int, int] | None:
    """``(n, m, r)`` of the factorization, or ``None`` where the tensor travels raw."""
    if len(shape) < 2:
        return None
    n = shape[0]
    m = int(np.prod(shape[1:], dtype=np.int64))
    r = min(rank, n, m)
    if n == 0 or m == 0 or r * (n + m) >= n * m:
        return None
    return n, m, r


def _start_factor(ctx: EncodeContext, state_key: str, m: int, r: int) -> Array:
    """The warm-start ``Q`` from state if usable, else a Gaussian one."""
    previous = ctx.state.get(state_key) if ctx.state is not None else None
    if (
        previous is not None
        and previous.shape == (m, r)
        and previous.dtype == np.float32
        and np.isfinite(previous).all()
        and np.any(previous)
    ):
        return previous
    return ctx.rng.standard_normal((m, r), dtype=np.float32)


@register
class PowerSGD(ArrayCodec):
    """``powersgd``: factors ``P`` (n x r) and ``Q`` (m x r) with ``M ≈ P Q^T``."""

    name = "powersgd"
    wire_id = 7
    linear = False
    reshapes = True
    params_spec: ClassVar[Mapping[str, Param]] = {"rank": Param(int, 4, low=1, high=4096)}

    def encode_array(self, array: Array, params: Params, ctx: EncodeContext, key: str) -> Payload:
        """One power iteration from the warm-started ``Q``; updates the state."""
        dims = matrix_dims(array.shape, int(params["rank"]))
        if dims is None:
            return {"raw": array}
        n, m, r = dims
        matrix = contiguous(array, np.float32).reshape(n, m)
        state_key = f"{key}.{ctx.tag}.q"
        left = matrix @ _start_factor(ctx, state_key, m, r)
        if not np.isfinite(left).all():
            raise NonFiniteError("codec 'powersgd': the tensor holds NaN or Inf values")
        left, _ = np.linalg.qr(left)
        right = matrix.T @ left
        if not np.isfinite(right).all():
            raise NonFiniteError("codec 'powersgd': the tensor holds NaN or Inf values")
        if ctx.state is not None:
            ctx.state[state_key] = right.copy()
        return {"p": left, "q": right, "shape": shape_part(array.shape)}

    def decode_array(self, parts: Mapping[str, Array], params: Params) -> Array:
        """``P @ Q.T`` in the original shape, or the raw tensor."""
        if "raw" in parts:
            check_parts(parts, {"raw"}, self.name)
            return parts["raw"]
        check_parts(parts, {"p", "q", "shape"}, self.name)
        shape = read_shape(parts, self.name)
        dims = matrix_dims(shape, int(params["rank"]))
        if dims is None:
            raise CodecError(f"codec 'powersgd': shape {shape} should have travelled raw")
        n, m, r = dims
        left, right = need(parts, "p", self.name, "float32"), need(parts, "q", self.name, "float32")
        if left.shape != (n, r) or right.shape != (m, r):
            raise CodecError(
                f"codec 'powersgd': factors {left.shape}, {right.shape} do not match "
                f"({n}, {r}), ({m}, {r}) for shape {shape}"
            )
        if not (np.isfinite(left).all() and np.isfinite(right).all()):
            raise CodecError("codec 'powersgd': factors hold NaN or Inf values")
        return (left @ right.T).reshape(shape)

    def estimate_array(self, dtype: str, shape: tuple[int, ...], params: Params) -> PayloadSpec:
        """``r (n + m)`` float32, or the raw tensor."""
        dims = matrix_dims(shape, int(params["rank"]))
        if dims is None:
            return {"raw": (dtype, shape)}
        n, m, r = dims
        return {
            "p": ("float32", (n, r)),
            "q": ("float32", (m, r)),
            "shape": ("uint64", (len(shape),)),
        }
