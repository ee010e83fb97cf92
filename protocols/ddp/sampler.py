"""Discrete Gaussian noise, sampled as Canonne, Kamath and Steinke (2020, Algorithm 3) do.

``N_Z(0, s^2)`` puts mass proportional to ``exp(-x^2 / (2 s^2))`` on every integer ``x``.
The sampler draws a discrete Laplace candidate of scale ``t = floor(s) + 1`` (the
difference of two geometric variables, which is exactly discrete Laplace) and keeps it with
probability ``exp(-(|y| - s^2 / t)^2 / (2 s^2))``. The acceptance test is done in float64,
vectorized, not with the paper's exact rational arithmetic: the output is integer-valued
(no low-order float bits to leak, unlike the continuous noise of Mironov's attack), and
the acceptance probability is off by at most float64 rounding.

Randomness comes from :func:`secure_generator`: NumPy's PCG64 seeded with 128 bits from
the operating system's cryptographic source (:mod:`secrets`), fresh per round and client.
PCG64 is not itself a cryptographic generator; what protects the noise is that its seed
never leaves the client and is never derived from anything another party knows.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import numpy.typing as npt

from geofl.protocols.ddp.errors import DistributedDpError

__all__ = ["IntArray", "discrete_gaussian", "secure_generator"]

IntArray = npt.NDArray[np.int64]


def secure_generator() -> np.random.Generator:
    """A NumPy generator seeded with 128 bits from the OS's cryptographic source."""
    return np.random.default_rng(secrets.randbits(128))


def discrete_gaussian(stddev: float, size: int, rng: np.random.Generator) -> IntArray:
    """``size`` independent draws of ``N_Z(0, stddev^2)``.

    Raises
    ------
    DistributedDpError
        If ``stddev`` is not a finite number > 0 or ``size`` is negative.
    """
    if not math.isfinite(stddev) or stddev <= 0:
        raise DistributedDpError(f"discrete Gaussian stddev must be finite and > 0, got {stddev}")
    if size < 0:
        raise DistributedDpError(f"size must be >= 0, got {size}")
    scale = math.floor(stddev) + 1
    success = -math.expm1(-1.0 / scale)  # geometric parameter of the discrete Laplace
    variance = stddev * stddev
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        batch = need + need // 2 + 16  # acceptance is above one half for every stddev
        candidates = rng.geometric(success, batch) - rng.geometric(success, batch)
        gap = np.abs(candidates) - variance / scale
        keep = candidates[rng.random(batch) < np.exp(-(gap * gap) / (2.0 * variance))]
        taken = keep[:need]
        out[filled : filled + taken.size] = taken
        filled += taken.size
    return out
