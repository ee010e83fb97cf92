"""The arithmetic of the robust rules against NumPy and against their definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.server.strategies.robust import kernels

SETTINGS = settings(max_examples=60, deadline=None)
FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def blocks(min_rows: int = 1) -> st.SearchStrategy[np.ndarray]:
    shape = st.tuples(st.integers(min_rows, 9), st.integers(1, 12))
    return hnp.arrays(np.float64, shape, elements=FINITE)


@SETTINGS
@given(blocks())
def test_median_is_numpys(block: np.ndarray) -> None:
    np.testing.assert_array_equal(kernels.coordinate_median(block), np.median(block, axis=0))


@SETTINGS
@given(blocks(), st.data())
def test_trimmed_mean_is_the_mean_of_the_sorted_middle(
    block: np.ndarray, data: st.DataObject
) -> None:
    n = block.shape[0]
    trim = data.draw(st.integers(0, (n - 1) // 2))
    result = kernels.trimmed_mean(block, trim)
    for column in range(block.shape[1]):  # brute force: drop the extremes one column at a time
        kept = sorted(block[:, column])[trim : n - trim]
        assert math.isclose(result[column], math.fsum(kept) / len(kept), rel_tol=1e-9, abs_tol=1e-6)


def test_trimmed_mean_refuses_trimming_everything() -> None:
    with pytest.raises(ValueError, match="cannot trim 2"):
        kernels.trimmed_mean(np.zeros((4, 3)), 2)


@SETTINGS
@given(blocks(), st.data())
def test_cut_counts_count_the_dropped_values(block: np.ndarray, data: st.DataObject) -> None:
    n, width = block.shape
    trim = data.draw(st.integers(0, (n - 1) // 2))
    counts = kernels.cut_counts(block, trim)
    assert counts.sum() == 2 * trim * width  # every coordinate drops trim from each end
    assert ((counts >= 0) & (counts <= width)).all()


@SETTINGS
@given(blocks(min_rows=2))
def test_square_distances_are_pairwise(block: np.ndarray) -> None:
    n = block.shape[0]
    into = np.zeros((n, n))
    half = block.shape[1] // 2
    kernels.accumulate_square_distances(block[:, :half], into)  # summed over two blocks
    kernels.accumulate_square_distances(block[:, half:], into)
    expected = ((block[:, None, :] - block[None, :, :]) ** 2).sum(axis=2)
    scale = float(np.abs(block - np.median(block, axis=0)).max(initial=0.0) ** 2) * block.shape[1]
    np.testing.assert_allclose(into, expected, rtol=1e-9, atol=1e-9 * max(scale, 1.0))


def test_close_updates_far_from_zero_keep_their_distances() -> None:
    """The cancellation the centring avoids: updates 1e-3 apart, all about 1e6 from zero
    (uncentred, |a|^2 ~ 5e13 leaves no digits for distances ~ 1e-4), and an attacker."""
    rng = np.random.default_rng(0)
    honest = 1e6 + 1e-3 * rng.normal(size=(6, 50))
    block = np.concatenate([honest, np.full((1, 50), 1e12)])
    into = np.zeros((7, 7))
    kernels.accumulate_square_distances(block, into)
    expected = ((honest[:, None, :] - honest[None, :, :]) ** 2).sum(axis=2)
    np.testing.assert_allclose(into[:6, :6], expected, rtol=1e-6, atol=1e-9)


@SETTINGS
@given(
    st.integers(0, 3),
    st.integers(0, 4),
    st.integers(1, 20),
    st.integers(0, 2**32 - 1),
    st.floats(1e3, 1e9),
)
def test_krum_selects_from_the_honest_cluster(
    byzantine: int, extra: int, width: int, seed: int, distance: float
) -> None:
    """f attackers far away (anywhere, even together) never win while n > 2f + 2."""
    n = 2 * byzantine + 3 + extra
    rng = np.random.default_rng(seed)
    honest = rng.normal(0.0, 1.0, size=(n - byzantine, width))
    attackers = distance + rng.normal(0.0, 1.0, size=(byzantine, width))
    updates = np.concatenate([attackers, honest])  # attackers first: order must not help
    distances = np.zeros((n, n))
    kernels.accumulate_square_distances(updates, distances)
    scores = kernels.krum_scores(distances, byzantine)
    chosen = kernels.krum_selection(scores, n - byzantine)
    assert (chosen >= byzantine).all(), chosen


def test_krum_refuses_too_few_updates() -> None:
    with pytest.raises(ValueError, match="n > 2f \\+ 2"):
        kernels.krum_scores(np.zeros((4, 4)), 1)


@SETTINGS
@given(
    hnp.arrays(np.float64, st.integers(1, 20), elements=st.floats(0, 1e12)), st.floats(1e-6, 1e6)
)
def test_clipping_never_exceeds_the_bound(norms: np.ndarray, bound: float) -> None:
    factors = kernels.clip_factors(norms, bound)
    assert (factors <= 1.0).all() and (factors > 0.0).all()
    assert (norms * factors <= bound * (1 + 1e-12)).all()
    np.testing.assert_array_equal(factors[norms <= bound], 1.0)


@SETTINGS
@given(
    st.floats(1e-3, 1e3),
    st.floats(0.0, 1.0),
    st.floats(0.05, 0.95),
    st.floats(0.01, 1.0),
)
@example(norm=1.0, unclipped=0.05000000000000001, target=0.05, rate=1.0)  # found in CI
@example(norm=1.0, unclipped=0.05, target=0.05000000000000001, rate=1.0)
def test_adaptive_clip_moves_toward_the_quantile(
    norm: float, unclipped: float, target: float, rate: float
) -> None:
    """Too many updates under the bound shrink it, too few grow it (Andrew et al. eq. 3)."""
    after = kernels.next_clip_norm(norm, unclipped, target, rate)
    # A gap of a few ulps moves exp(-rate * gap) by less than one ulp of 1.0: then the
    # norm may stay put, but never move the wrong way.
    moves = abs(unclipped - target) * rate > 1e-12
    if unclipped > target:
        assert after < norm if moves else after <= norm
    elif unclipped < target:
        assert after > norm if moves else after >= norm
    else:
        assert after == norm
    assert math.isclose(after, norm * math.exp(-rate * (unclipped - target)))


def test_adaptive_clip_converges_to_the_quantile_of_fixed_norms() -> None:
    """Iterated on a fixed population of norms, the clip norm settles at its quantile."""
    rng = np.random.default_rng(7)
    norms = rng.lognormal(0.0, 1.0, size=2000)
    clip = 0.01
    for _ in range(400):
        clip = kernels.next_clip_norm(clip, float((norms <= clip).mean()), 0.3, 0.2)
    assert abs(float((norms <= clip).mean()) - 0.3) < 0.02
