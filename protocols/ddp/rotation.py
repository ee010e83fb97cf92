"""The randomized Hadamard rotation that flattens a vector before it is rounded.

``R x = H D x`` with ``D`` a diagonal of random signs and ``H`` the orthonormal
Walsh-Hadamard matrix of size ``2^k >= len(x)`` (``x`` zero-padded). ``R`` preserves the L2
norm, and for a fixed ``x`` each rotated coordinate is a Rademacher sum with variance proxy
``|x|^2 / 2^k``: no coordinate is large, which is what keeps the sum of the cohort inside
the ring (Kairouz, Liu and Steinke 2021, section 4). ``H`` is symmetric and its own
inverse, so ``R^-1 y = D H y``.

The signs come from a public per-round seed the server sends to every client: they need
not be secret, only independent of the updates.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["FloatArray", "padded_size", "rotate", "unrotate"]

FloatArray = npt.NDArray[np.float64]


def padded_size(dimension: int) -> int:
    """The smallest power of two that holds ``dimension`` values (at least 1)."""
    return 1 << max(0, (dimension - 1).bit_length())


def _hadamard(values: FloatArray) -> FloatArray:
    """The orthonormal fast Walsh-Hadamard transform of a power-of-two-long vector."""
    size = values.size
    out = values.copy()
    half = 1
    while half < size:
        blocks = out.reshape(-1, 2, half)
        upper, lower = blocks[:, 0, :].copy(), blocks[:, 1, :]
        blocks[:, 0, :] += lower
        np.subtract(upper, lower, out=blocks[:, 1, :])
        half *= 2
    out *= 1.0 / np.sqrt(size)
    return out


def _signs(seed: bytes, size: int) -> FloatArray:
    rng = np.random.default_rng(int.from_bytes(seed, "big"))
    signs: FloatArray = rng.integers(0, 2, size=size).astype(np.float64) * 2.0 - 1.0
    return signs


def rotate(vector: FloatArray, seed: bytes) -> FloatArray:
    """``H D x`` of ``vector`` zero-padded to :func:`padded_size`."""
    padded = np.zeros(padded_size(vector.size), dtype=np.float64)
    padded[: vector.size] = vector
    padded *= _signs(seed, padded.size)
    return _hadamard(padded)


def unrotate(rotated: FloatArray, seed: bytes, dimension: int) -> FloatArray:
    """The first ``dimension`` values of ``D H y``: the inverse of :func:`rotate`."""
    restored = _hadamard(rotated)
    restored *= _signs(seed, rotated.size)
    return restored[:dimension].copy()
