"""The distributed discrete Gaussian's arithmetic: sampler moments, rotation, rounding,
and quantize/dequantize round trips through the ring (seeded, loose bounds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.ddp import (
    DistributedDpError,
    DistributedDpParams,
    clip_to_norm,
    conditional_round,
    discrete_gaussian,
    padded_size,
    plan_granularity,
    rotate,
    rounding_bound,
    unrotate,
    wrap_probability,
)

SAMPLES = 20_000


@settings(deadline=None, max_examples=25)
@given(stddev=st.floats(1.0, 1e6), seed=st.integers(0, 2**32 - 1))
def test_discrete_gaussian_moments(stddev: float, seed: int) -> None:
    """Mean 0 and variance s^2 (for s >= 1 the discrete variance is s^2 within 1e-8)."""
    draws = discrete_gaussian(stddev, SAMPLES, np.random.default_rng(seed))
    assert draws.dtype == np.int64 and draws.size == SAMPLES
    assert abs(float(draws.mean())) < 5 * stddev / math.sqrt(SAMPLES)
    assert float(draws.var()) == pytest.approx(stddev**2, rel=0.08)
    # Symmetric, and Gaussian-tailed: almost nothing beyond 5 standard deviations.
    assert float(np.mean(np.abs(draws) > 5 * stddev)) < 1e-3


def test_small_stddev_puts_most_mass_on_zero() -> None:
    draws = discrete_gaussian(0.3, SAMPLES, np.random.default_rng(1))
    expected = 1 / sum(math.exp(-(k * k) / (2 * 0.09)) for k in range(-5, 6))
    assert float(np.mean(draws == 0)) == pytest.approx(expected, abs=0.02)


@pytest.mark.parametrize("stddev", [0.0, -1.0, math.inf, math.nan])
def test_sampler_refuses_a_bad_stddev(stddev: float) -> None:
    with pytest.raises(DistributedDpError, match="stddev"):
        discrete_gaussian(stddev, 3, np.random.default_rng(0))


@settings(deadline=None, max_examples=50)
@given(size=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
def test_rotation_is_orthonormal_and_invertible(size: int, seed: int) -> None:
    vector = np.random.default_rng(seed).normal(size=size)
    key = seed.to_bytes(8, "big")
    rotated = rotate(vector, key)
    assert rotated.size == padded_size(size) >= size
    assert float(np.linalg.norm(rotated)) == pytest.approx(float(np.linalg.norm(vector)))
    np.testing.assert_allclose(unrotate(rotated, key, size), vector, atol=1e-9)


def test_rotation_flattens_a_spike() -> None:
    """One large coordinate becomes 2^k coordinates of size 1/sqrt(2^k) (what bounds wrap)."""
    spike = np.zeros(1024)
    spike[3] = 1.0
    rotated = rotate(spike, b"seed")
    np.testing.assert_allclose(np.abs(rotated), 1 / 32)


@settings(deadline=None, max_examples=50)
@given(
    size=st.integers(1, 2000),
    scale=st.floats(0.1, 1e4),
    seed=st.integers(0, 2**32 - 1),
)
def test_conditional_rounding_respects_the_norm_bound(size: int, scale: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    vector = rng.normal(size=size)
    vector *= scale / np.linalg.norm(vector)
    bound = rounding_bound(scale, size)
    rounded = conditional_round(vector, bound, rng)
    assert float(np.linalg.norm(rounded)) <= bound
    assert np.all(np.abs(rounded - vector) < 1)


def test_clipping_only_shortens() -> None:
    long, short = np.full(4, 3.0), np.full(4, 0.1)
    assert float(np.linalg.norm(clip_to_norm(long, 1.0))) == pytest.approx(1.0)
    np.testing.assert_array_equal(clip_to_norm(short, 1.0), short)
    with pytest.raises(DistributedDpError, match="NaN"):
        clip_to_norm(np.array([np.nan]), 1.0)


def _params(dimension: int, granularity: float, ring_bits: int = 32) -> DistributedDpParams:
    scaled = 1.0 / granularity
    return DistributedDpParams(
        clip_norm=1.0,
        granularity=granularity,
        noise_stddev=3.0,
        rounding_bound=rounding_bound(scaled, padded_size(dimension)),
        dimension=dimension,
        rotation_seed=b"round seed",
        ring_bits=ring_bits,
        min_survivors=2,
    )


@settings(deadline=None, max_examples=40)
@given(
    dimension=st.integers(1, 1500),
    clients=st.integers(1, 20),
    granularity=st.floats(1e-6, 1e-2),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantize_dequantize_round_trip(
    dimension: int, clients: int, granularity: float, seed: int
) -> None:
    """Without noise, the decoded ring sum is the sum of the clipped updates, within one
    grid step per rotated coordinate per client (negative values wrap and come back)."""
    params = _params(dimension, granularity)
    rng = np.random.default_rng(seed)
    updates = [rng.normal(size=dimension) * rng.uniform(0.1, 3) for _ in range(clients)]
    total = np.zeros(params.padded_dimension, dtype=np.uint32)
    for update in updates:
        total += params.to_ring(params.integer_vector(update, rng))  # wraps modulo 2^32
    decoded = params.decode_sum(total)
    exact = sum(clip_to_norm(u, 1.0) for u in updates)
    error = float(np.linalg.norm(decoded - exact))
    assert error <= clients * granularity * math.sqrt(params.padded_dimension)


def test_encoded_noise_survives_the_round_trip() -> None:
    """With noise, the decoded sum differs from the clipped sum by noise of the planned std."""
    params = _params(4096, 1e-4)
    rng = np.random.default_rng(7)
    update = rng.normal(size=4096)
    clients = 5
    total = np.zeros(params.padded_dimension, dtype=np.uint32)
    for _ in range(clients):
        total += params.encode(update, rng)
    residual = params.decode_sum(total) - clients * clip_to_norm(update, 1.0)
    expected = math.sqrt(clients) * params.noise_stddev * params.granularity
    assert float(residual.std()) == pytest.approx(expected, rel=0.1)


def test_granularity_keeps_wrap_around_below_the_bound() -> None:
    gamma = plan_granularity(1.0, 0.1, 100, 8192, 16, 1e-9)
    assert wrap_probability(1.0, 0.1, gamma, 100, 8192, 16) == pytest.approx(1e-9, rel=1e-6)
    assert wrap_probability(1.0, 0.1, gamma / 2, 100, 8192, 16) > 1e-9
    with pytest.raises(DistributedDpError, match="8-bit ring cannot hold the sum of 200"):
        plan_granularity(1.0, 0.1, 200, 8192, 8, 1e-9)


def test_decode_refuses_a_wrong_length() -> None:
    params = _params(10, 1e-3)
    with pytest.raises(DistributedDpError, match="expected 16"):
        params.decode_sum(np.zeros(10, dtype=np.uint32))
