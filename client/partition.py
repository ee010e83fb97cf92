"""Split a data set among simulated clients: IID, or label-skewed with a Dirichlet prior.

Federated benchmarks need heterogeneous clients; the usual model (Hsu et al., 2019) draws,
for each class, the share each client gets from ``Dirichlet(alpha)``: small ``alpha`` gives
each client few classes, large ``alpha`` approaches IID. Everything here is pure NumPy with
an explicit seed, so every process of a simulation computes the same split independently.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["dirichlet_partition", "iid_partition", "label_histogram"]

IndexArray = npt.NDArray[np.int64]


def _check_counts(n_samples: int, num_partitions: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"num_partitions must be >= 1, got {num_partitions}")
    if n_samples < num_partitions:
        raise ValueError(
            f"cannot split {n_samples} samples into {num_partitions} non-empty partitions"
        )


def iid_partition(n_samples: int, num_partitions: int, seed: int) -> list[IndexArray]:
    """Shuffle ``range(n_samples)`` and cut it into near-equal parts.

    Returns
    -------
    list of ndarray
        ``num_partitions`` sorted int64 index arrays, disjoint, covering every sample once;
        sizes differ by at most one.
    """
    _check_counts(n_samples, num_partitions)
    order = np.random.default_rng(seed).permutation(n_samples).astype(np.int64)
    return [np.sort(part) for part in np.array_split(order, num_partitions)]


def _as_labels(labels: npt.ArrayLike) -> npt.NDArray[np.int64]:
    array = np.asarray(labels)
    if array.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {array.dtype}")
    if array.size and array.min() < 0:
        raise ValueError("labels must be non-negative class indices")
    return array.astype(np.int64)


def _dirichlet_once(
    labels: npt.NDArray[np.int64], num_partitions: int, alpha: float, rng: np.random.Generator
) -> list[IndexArray]:
    chunks: list[list[IndexArray]] = [[] for _ in range(num_partitions)]
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls)).astype(np.int64)
        shares = rng.dirichlet(np.full(num_partitions, alpha))
        cuts = (np.cumsum(shares)[:-1] * members.size).astype(np.int64)
        for part, piece in enumerate(np.split(members, cuts)):
            chunks[part].append(piece)
    return [np.sort(np.concatenate(c)) for c in chunks]


def dirichlet_partition(
    labels: npt.ArrayLike,
    num_partitions: int,
    alpha: float,
    seed: int,
    min_size: int = 10,
    max_tries: int = 100,
) -> list[IndexArray]:
    """Split samples so each class is spread over partitions by ``Dirichlet(alpha)``.

    Parameters
    ----------
    labels
        One class index per sample.
    num_partitions
        How many clients to split among.
    alpha
        Concentration; smaller means more label skew (0.1 is severe, 100 nearly IID).
    seed
        Seed of the generator; the same arguments always give the same split.
    min_size
        Smallest acceptable partition; draws that leave a client with fewer samples are
        redrawn, since a client without data cannot train.
    max_tries
        How many draws to attempt before giving up.

    Returns
    -------
    list of ndarray
        Sorted int64 index arrays, disjoint, covering every sample exactly once.

    Raises
    ------
    ValueError
        On invalid arguments, or if no draw within ``max_tries`` satisfies ``min_size``.
    """
    array = _as_labels(labels)
    _check_counts(array.size, num_partitions)
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    if min_size < 0 or min_size * num_partitions > array.size:
        raise ValueError(
            f"min_size={min_size} is impossible for {array.size} samples in "
            f"{num_partitions} partitions"
        )
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    rng = np.random.default_rng(seed)
    smallest = 0
    for _ in range(max_tries):
        parts = _dirichlet_once(array, num_partitions, alpha, rng)
        smallest = min(part.size for part in parts)
        if smallest >= min_size:
            return parts
    raise ValueError(
        f"no Dirichlet(alpha={alpha}) split of {array.size} samples into {num_partitions} "
        f"partitions gave every partition >= {min_size} samples in {max_tries} tries "
        f"(last smallest: {smallest}); raise alpha, lower min_size or use fewer partitions"
    )


def label_histogram(
    labels: npt.ArrayLike, parts: list[IndexArray], num_classes: int | None = None
) -> npt.NDArray[np.int64]:
    """Count each class in each partition, to inspect or report a split's skew.

    Returns
    -------
    ndarray
        Shape ``(len(parts), num_classes)``; ``num_classes`` defaults to ``max(labels) + 1``.
    """
    array = _as_labels(labels)
    seen = int(array.max()) + 1 if array.size else 0
    classes = seen if num_classes is None else num_classes
    if classes < seen:
        raise ValueError(f"num_classes={num_classes} but labels go up to {seen - 1}")
    hist = np.zeros((len(parts), classes), dtype=np.int64)
    for row, part in enumerate(parts):
        hist[row] = np.bincount(array[part], minlength=classes)
    return hist
