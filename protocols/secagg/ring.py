"""The ring Z / 2**ring_bits and fixed-point quantization into it.

Ring elements live in the smallest unsigned dtype that holds ``ring_bits`` bits
(uint8, uint16 or uint32).  NumPy's unsigned array arithmetic wraps modulo the dtype's
width, a multiple of ``2**ring_bits``, so sums may be reduced once at the end with
:func:`ring_reduce` (a bit mask; a no-op when ``ring_bits`` is 8, 16 or 32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from geofl.protocols.secagg.errors import SecAggError

MIN_RING_BITS = 8
MAX_RING_BITS = 32
RingArray = npt.NDArray[np.unsignedinteger[Any]]
FloatArray = npt.NDArray[np.float64]


def check_ring_bits(ring_bits: int) -> int:
    """``ring_bits`` itself, or a clear error when it is not an int in 8..32."""
    valid = isinstance(ring_bits, int) and not isinstance(ring_bits, bool)
    if not valid or not MIN_RING_BITS <= ring_bits <= MAX_RING_BITS:
        raise SecAggError(
            f"ring_bits must be an int in {MIN_RING_BITS}..{MAX_RING_BITS}, got {ring_bits!r}"
        )
    return ring_bits


def ring_dtype(ring_bits: int) -> np.dtype[np.unsignedinteger[Any]]:
    """The smallest unsigned dtype holding ``ring_bits`` bits."""
    bits = check_ring_bits(ring_bits)
    width = 8 if bits <= 8 else 16 if bits <= 16 else 32
    return np.dtype(f"uint{width}")


def ring_reduce(values: RingArray, ring_bits: int) -> RingArray:
    """Reduce ``values`` modulo ``2**ring_bits`` in place, and return them."""
    if ring_bits not in (8, 16, 32):
        np.bitwise_and(values, (1 << ring_bits) - 1, out=values)
    return values


def check_ring_vector(vector: object, ring_bits: int, what: str) -> RingArray:
    """``vector`` if it is a 1-D array of ring elements, else an error naming ``what``."""
    dtype = ring_dtype(ring_bits)
    if not isinstance(vector, np.ndarray):
        raise SecAggError(f"{what} must be a NumPy array, got {type(vector).__name__}")
    if vector.dtype != dtype or vector.ndim != 1:
        raise SecAggError(
            f"{what} must be a 1-D {dtype} array for a {ring_bits}-bit ring, "
            f"got {vector.ndim}-D {vector.dtype}"
        )
    if ring_bits != dtype.itemsize * 8 and vector.size and int(vector.max()) >> ring_bits:
        raise SecAggError(f"{what} holds values >= 2**{ring_bits}, outside the ring")
    return vector


#: Coordinates quantized per pass (and uniform draws per call: the same stream as one call
#: for all). Each step of :meth:`RingQuantizer.encode` then works on a block that stays in
#: the CPU's cache instead of streaming a model-sized float64 array through memory eight
#: times.
_BLOCK = 1 << 16


@dataclass(frozen=True)
class RingQuantizer:
    """Stochastic fixed-point quantization of clipped floats into the ring.

    Each coordinate is clipped to ``[-clip, clip]`` and mapped onto the integer levels
    ``0 .. levels-1`` spaced :attr:`step` apart; ``levels - 1`` is the largest value with
    ``cohort * (levels - 1) < 2**ring_bits``, so the sum of ``cohort`` encodings never
    wraps and :meth:`decode_sum` recovers it exactly.  Rounding up with probability equal
    to the fractional part makes each encoding unbiased; its error is below one
    ``step`` per coordinate, so a decoded sum over ``count`` clients is within
    ``count * step`` of the sum of the clipped vectors (:meth:`error_bound`), with a
    standard deviation of at most ``sqrt(count) * step / 2``.
    """

    clip: float
    ring_bits: int
    cohort: int

    def __post_init__(self) -> None:
        check_ring_bits(self.ring_bits)
        if not isinstance(self.clip, int | float) or not math.isfinite(self.clip) or self.clip <= 0:
            raise SecAggError(f"clip must be a finite number > 0, got {self.clip!r}")
        if isinstance(self.cohort, bool) or not isinstance(self.cohort, int) or self.cohort < 1:
            raise SecAggError(f"cohort must be an int >= 1, got {self.cohort!r}")
        if self.cohort >= 1 << self.ring_bits:
            raise SecAggError(
                f"a cohort of {self.cohort} clients cannot be summed in a {self.ring_bits}-bit "
                f"ring without overflow: use ring_bits > {self.cohort.bit_length()}"
            )

    @property
    def levels(self) -> int:
        """Number of quantization levels per client and coordinate."""
        return ((1 << self.ring_bits) - 1) // self.cohort + 1

    @property
    def step(self) -> float:
        """Distance between levels; one encoding is off by less than this per coordinate."""
        return 2.0 * self.clip / (self.levels - 1)

    @property
    def dtype(self) -> np.dtype[np.unsignedinteger[Any]]:
        """Storage dtype of the ring elements."""
        return ring_dtype(self.ring_bits)

    def error_bound(self, count: int) -> float:
        """Largest per-coordinate error of :meth:`decode_sum` over ``count`` clients."""
        return count * self.step

    def encode(self, x: npt.NDArray[np.floating[Any]], rng: np.random.Generator) -> RingArray:
        """Clip, scale and stochastically round ``x`` to ring levels (same shape).

        ``x`` is left as it is. The work goes block by block through two cache-sized float64
        buffers, in the same order of operations (and so to the same bits) as on one
        float64 copy of ``x``.
        """
        if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
            raise SecAggError("quantization needs a floating-point NumPy array")
        if not np.isfinite(x).all():
            raise SecAggError("the vector holds NaN or Inf values; refusing to quantize it")
        source = x.reshape(-1)  # a copy only if x is not contiguous
        out = np.empty(source.size, dtype=self.dtype)
        levels = np.empty(min(_BLOCK, source.size), dtype=np.float64)
        draws = np.empty_like(levels)
        scale, top = 1.0 / self.step, self.levels - 1
        for start in range(0, source.size, _BLOCK):
            stop = min(start + _BLOCK, source.size)
            block, uniform = levels[: stop - start], draws[: stop - start]
            block[...] = source[start:stop]  # to float64 first: clip is a float64 bound
            np.minimum(block, self.clip, out=block)
            np.maximum(block, -self.clip, out=block)
            block += self.clip
            block *= scale
            rng.random(out=uniform)
            block += uniform
            np.floor(block, out=block)
            np.minimum(block, top, out=block)
            out[start:stop] = block
        return out.reshape(x.shape)

    def decode_sum(self, total: RingArray, count: int) -> FloatArray:
        """The float64 sum of ``count`` clients' clipped vectors from their ring sum."""
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= self.cohort:
            raise SecAggError(f"count must be an int in 1..{self.cohort}, got {count!r}")
        if not isinstance(total, np.ndarray) or total.dtype != self.dtype:
            raise SecAggError(f"the ring sum must be a {self.dtype} array")
        if total.size and int(total.max()) > count * (self.levels - 1):
            raise SecAggError(
                f"the ring sum exceeds what {count} clients can produce: masks did not cancel"
            )
        return total.astype(np.float64) * self.step - count * self.clip


__all__ = [
    "MAX_RING_BITS",
    "MIN_RING_BITS",
    "RingArray",
    "RingQuantizer",
    "check_ring_bits",
    "check_ring_vector",
    "ring_dtype",
    "ring_reduce",
]
