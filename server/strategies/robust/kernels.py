"""The arithmetic of the robust rules, on plain float64 arrays (no I/O, no state).

A *block* is an ``(n, B)`` array: ``B`` coordinates of each of the ``n`` updates of a
round. The coordinate-wise rules reduce a block along axis 0; the geometric rules (Krum,
centered clipping) need distances, which are sums over every block.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from geofl.server.strategies._numeric import F64Array

__all__ = [
    "accumulate_square_distances",
    "clip_factors",
    "coordinate_median",
    "cut_counts",
    "krum_scores",
    "krum_selection",
    "next_clip_norm",
    "trimmed_mean",
]


def coordinate_median(block: F64Array) -> F64Array:
    """The median of each coordinate (column); the mean of the middle two for even ``n``."""
    return np.asarray(np.median(block, axis=0), dtype=np.float64)


def trimmed_mean(block: F64Array, trim: int) -> F64Array:
    """The mean of each coordinate after dropping its ``trim`` largest and smallest values.

    Requires ``2 * trim < n``.
    """
    n = block.shape[0]
    if not 0 <= 2 * trim < n:
        raise ValueError(f"trimmed mean of {n} values cannot trim {trim} from each end")
    ordered = np.sort(block, axis=0)
    return np.asarray(ordered[trim : n - trim].mean(axis=0), dtype=np.float64)


def cut_counts(block: F64Array, trim: int) -> npt.NDArray[np.int64]:
    """Per update: in how many of the block's coordinates it was among the ``trim``
    smallest or largest (the values a trimmed mean drops; ties broken by position)."""
    n = block.shape[0]
    ranks = np.argsort(np.argsort(block, axis=0, kind="stable"), axis=0, kind="stable")
    cut = (ranks < trim) | (ranks >= n - trim)
    return np.asarray(cut.sum(axis=1), dtype=np.int64)


def accumulate_square_distances(block: F64Array, into: F64Array) -> None:
    """Add the block's squared pairwise distances to the ``(n, n)`` matrix ``into``.

    By the Gram matrix (one BLAS product, ``|a|^2 + |b|^2 - 2ab``) after subtracting each
    coordinate's median: distances do not change under translation, and centring inside
    the honest majority keeps honest values small, so close updates far from zero keep
    their distances (uncentred, ``|a|^2`` would leave no digits for them).
    """
    centred = block - np.median(block, axis=0)
    gram = centred @ centred.T
    square = np.diag(gram)
    distances = square[:, None] + square[None, :] - 2.0 * gram
    np.maximum(distances, 0.0, out=distances)
    np.fill_diagonal(distances, 0.0)
    into += distances


def krum_scores(square_distances: F64Array, byzantine: int) -> F64Array:
    """Krum's score of each update (Blanchard et al. 2017): the sum of its squared
    distances to its ``n - byzantine - 2`` nearest other updates. Requires ``n > 2f + 2``."""
    n = square_distances.shape[0]
    if n <= 2 * byzantine + 2:
        raise ValueError(f"krum needs n > 2f + 2 updates, got n={n}, f={byzantine}")
    neighbours = n - byzantine - 2
    others = square_distances + np.diag(np.full(n, np.inf))  # never one's own neighbour
    nearest = np.sort(others, axis=1)[:, :neighbours]
    return np.asarray(nearest.sum(axis=1), dtype=np.float64)


def krum_selection(scores: F64Array, select: int) -> npt.NDArray[np.int64]:
    """Indices of the ``select`` lowest scores (multi-Krum; 1 is Krum), ties by position."""
    order = np.argsort(scores, kind="stable")
    return np.asarray(np.sort(order[:select]), dtype=np.int64)


def clip_factors(norms: F64Array, bound: float) -> F64Array:
    """``min(1, bound / norm)`` per update: the scale that brings its norm to ``bound``."""
    over = norms > bound
    safe = np.where(over, norms, 1.0)  # no division by zero for an all-zero update
    return np.asarray(np.where(over, bound / safe, 1.0), dtype=np.float64)


def next_clip_norm(
    clip_norm: float, unclipped_fraction: float, target_quantile: float, learning_rate: float
) -> float:
    """One geometric step of adaptive clipping (Andrew et al. 2021, eq. 3):
    ``C * exp(-eta * (b - gamma))``, ``b`` the share of updates with norm <= ``C``.

    Too many updates under the bound (``b > gamma``) shrinks it, too few grows it, so ``C``
    tracks the ``gamma`` quantile of the update norms.
    """
    return clip_norm * math.exp(-learning_rate * (unclipped_fraction - target_quantile))
