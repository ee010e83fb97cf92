"""A client's update into the ring with its share of discrete Gaussian noise, and back.

The client side of the distributed discrete Gaussian mechanism (Kairouz, Liu and Steinke
2021, Algorithm 1), in the ring ``Z / 2^ring_bits`` of secure aggregation:

1. clip the flat update ``x`` to L2 norm ``clip_norm`` (``C``);
2. rotate it (:mod:`geofl.protocols.ddp.rotation`), which keeps the norm and flattens it;
3. scale by ``1 / granularity`` (``gamma``) and round every coordinate randomly (up with
   probability equal to its fractional part), again until the rounded vector's L2 norm
   is at most :func:`rounding_bound` (*conditional* randomized rounding): every client's
   integer vector then has a bounded norm, which is the sensitivity the accountant uses;
4. add ``N_Z(0, noise_stddev^2)`` to every coordinate and reduce modulo ``2^ring_bits``.

Only then is the vector masked: the server unmasks a sum that carries every survivor's
noise. :meth:`DistributedDpParams.decode_sum` maps the unmasked ring sum to signed
integers, multiplies by ``gamma`` and rotates back; the caller divides by its fixed
public denominator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from geofl.protocols.ddp.errors import DistributedDpError
from geofl.protocols.ddp.rotation import FloatArray, padded_size, rotate, unrotate
from geofl.protocols.ddp.sampler import IntArray, discrete_gaussian
from geofl.protocols.secagg.ring import RingArray, check_ring_bits, ring_dtype

__all__ = [
    "ROUNDING_BETA",
    "DistributedDpParams",
    "clip_to_norm",
    "conditional_round",
    "plan_granularity",
    "rounding_bound",
    "wrap_probability",
]

#: The paper's choice: each rounding attempt exceeds the bound with probability below
#: this (so about 1.65 attempts on average), for an inflation of the bound of about
#: ``sqrt(d / 4 + C / gamma)`` steps.
ROUNDING_BETA = math.exp(-0.5)

#: Attempts before conditional rounding gives up (each fails with probability < beta).
_MAX_ROUNDING_ATTEMPTS = 1000


def rounding_bound(scaled_clip: float, dimension: int, beta: float = ROUNDING_BETA) -> float:
    """The L2 bound, in integer steps, that conditional randomized rounding enforces.

    ``min(D + sqrt(d), sqrt(D^2 + d/4 + sqrt(2 ln(1/beta)) (D + sqrt(d)/2)))`` for a
    vector of norm at most ``D = clip_norm / gamma`` in ``d`` dimensions (Kairouz et al.
    2021, section 4.1): a randomized rounding lands under it with probability >= 1 - beta.
    """
    if not 0 < beta < 1:
        raise DistributedDpError(f"beta must be in (0, 1), got {beta}")
    root = math.sqrt(dimension)
    worst = scaled_clip + root
    likely = (
        scaled_clip**2
        + dimension / 4
        + math.sqrt(2 * math.log(1 / beta)) * (scaled_clip + root / 2)
    )
    return min(worst, math.sqrt(likely))


def wrap_probability(
    clip_norm: float,
    local_stddev: float,
    granularity: float,
    cohort: int,
    dimension: int,
    ring_bits: int,
) -> float:
    """An upper bound on the chance that some coordinate of the cohort's sum wraps.

    Coordinate ``j`` of the sum is ``sum_k round(y_k)_j + noise``. Rounding moves each
    client's value by less than one step, so ``|sum| <= cohort + |S_j + N_j|`` with ``S_j``
    the rotated sum of the clipped updates (norm at most ``cohort * C``; a Rademacher sum
    over the rotation's signs, variance proxy ``(cohort C / gamma)^2 / d``) and ``N_j`` the
    sum of ``cohort`` discrete Gaussians (each sub-Gaussian with proxy ``s^2``: Canonne et
    al. 2020). Hoeffding and a union bound over the ``d`` coordinates give
    ``P(wrap) <= 2 d exp(-t^2 / (2 v))`` with ``t = 2^(bits-1) - 1 - cohort``. It assumes
    the updates do not depend on the round's rotation seed (true of honest clients, who
    train before they see it).
    """
    room = (1 << (ring_bits - 1)) - 1 - cohort
    if room <= 0:
        return 1.0
    proxy = ((cohort * clip_norm) ** 2 / dimension + cohort * local_stddev**2) / granularity**2
    return min(1.0, 2 * dimension * math.exp(-(room**2) / (2 * proxy)))


def plan_granularity(
    clip_norm: float,
    local_stddev: float,
    cohort: int,
    dimension: int,
    ring_bits: int,
    wrap: float,
) -> float:
    """The finest step ``gamma`` whose :func:`wrap_probability` is at most ``wrap``.

    ``dimension`` is the rotated (padded) one.

    Raises
    ------
    DistributedDpError
        If the ring cannot hold the cohort's rounding error at all.
    """
    check_ring_bits(ring_bits)
    room = (1 << (ring_bits - 1)) - 1 - cohort
    if room <= 0:
        raise DistributedDpError(
            f"a {ring_bits}-bit ring cannot hold the sum of {cohort} rounded updates "
            f"(need 2^(ring_bits-1) > {cohort + 1}): raise secure_aggregation.ring_bits"
        )
    spread = (cohort * clip_norm) ** 2 / dimension + cohort * local_stddev**2
    return math.sqrt(2 * math.log(2 * dimension / wrap) * spread) / room


def clip_to_norm(vector: FloatArray, clip_norm: float) -> FloatArray:
    """``vector`` scaled down to L2 norm ``clip_norm`` if it is longer (a copy)."""
    if not np.isfinite(vector).all():
        raise DistributedDpError("the update holds NaN or Inf values; refusing to encode it")
    norm = float(np.linalg.norm(vector))
    scale = min(1.0, clip_norm / norm) if norm > 0 else 1.0
    clipped: FloatArray = vector * scale
    return clipped


def conditional_round(scaled: FloatArray, bound: float, rng: np.random.Generator) -> IntArray:
    """Randomized rounding of ``scaled``, redrawn until its L2 norm is at most ``bound``.

    Raises
    ------
    DistributedDpError
        If no attempt out of many lands under the bound (the input was longer than the
        bound was computed for).
    """
    floor = np.floor(scaled)
    fraction = scaled - floor
    limit = bound * bound * (1 - 1e-12)  # a margin for float64 rounding of the norm
    for _ in range(_MAX_ROUNDING_ATTEMPTS):
        rounded = floor + (rng.random(scaled.size) < fraction)
        if float(np.dot(rounded, rounded)) <= limit:
            return rounded.astype(np.int64)
    raise DistributedDpError(
        f"conditional rounding found no rounding within the norm bound {bound:.6g} in "
        f"{_MAX_ROUNDING_ATTEMPTS} attempts: the update was not clipped to the clip norm"
    )


@dataclass(frozen=True)
class DistributedDpParams:
    """One round's distributed discrete Gaussian parameters, as every client receives them.

    Attributes
    ----------
    clip_norm
        ``C``: the L2 bound of an update, in update units.
    granularity
        ``gamma``: one integer step of the ring, in update units.
    noise_stddev
        Each client's discrete Gaussian std, in integer steps.
    rounding_bound
        The L2 bound of every rounded vector, in integer steps (:func:`rounding_bound`).
    dimension
        Floats in the update (before padding to a power of two).
    rotation_seed
        The round's public seed of the rotation's signs.
    ring_bits
        The secure-aggregation ring ``Z / 2^ring_bits``.
    min_survivors
        The fewest survivors whose noise the accountant counts on.
    """

    clip_norm: float
    granularity: float
    noise_stddev: float
    rounding_bound: float
    dimension: int
    rotation_seed: bytes
    ring_bits: int
    min_survivors: int

    def __post_init__(self) -> None:
        check_ring_bits(self.ring_bits)
        positives = {
            "clip_norm": self.clip_norm,
            "granularity": self.granularity,
            "noise_stddev": self.noise_stddev,
            "rounding_bound": self.rounding_bound,
        }
        bad = {k: v for k, v in positives.items() if not (math.isfinite(v) and v > 0)}
        if bad:
            raise DistributedDpError(f"distributed DP needs finite values > 0, got {bad}")
        if self.dimension < 1 or self.min_survivors < 1 or not self.rotation_seed:
            raise DistributedDpError(
                "distributed DP needs dimension >= 1, min_survivors >= 1 and a rotation seed; "
                f"got {self.dimension}, {self.min_survivors}, {len(self.rotation_seed)} bytes"
            )

    @property
    def padded_dimension(self) -> int:
        """The length of the rotated vector, hence of the ring vector sent."""
        return padded_size(self.dimension)

    def integer_vector(self, update: FloatArray, rng: np.random.Generator) -> IntArray:
        """Steps 1-3: clipped, rotated, scaled and conditionally rounded, before noise."""
        if update.ndim != 1 or update.size != self.dimension:
            raise DistributedDpError(
                f"the update has shape {update.shape}, expected ({self.dimension},)"
            )
        flat = rotate(clip_to_norm(update.astype(np.float64), self.clip_norm), self.rotation_seed)
        flat *= 1.0 / self.granularity
        return conditional_round(flat, self.rounding_bound, rng)

    def to_ring(self, values: IntArray) -> RingArray:
        """Signed integers reduced modulo ``2^ring_bits``, in the ring's dtype."""
        reduced = np.bitwise_and(values, (1 << self.ring_bits) - 1)
        return reduced.astype(ring_dtype(self.ring_bits))

    def encode(self, update: FloatArray, rng: np.random.Generator) -> RingArray:
        """The update's ring vector with this client's noise share added (steps 1-4)."""
        integers = self.integer_vector(update, rng)
        integers += discrete_gaussian(self.noise_stddev, integers.size, rng)
        return self.to_ring(integers)

    def decode_sum(self, total: RingArray) -> FloatArray:
        """The float sum of the survivors' (noised) updates from their unmasked ring sum."""
        if total.ndim != 1 or total.size != self.padded_dimension:
            raise DistributedDpError(
                f"the ring sum has {total.size} values, expected {self.padded_dimension}"
            )
        signed = total.astype(np.int64)
        signed[signed >= 1 << (self.ring_bits - 1)] -= 1 << self.ring_bits
        scaled: FloatArray = signed.astype(np.float64) * self.granularity
        return unrotate(scaled, self.rotation_seed, self.dimension)
