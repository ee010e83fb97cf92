"""Properties of the IID and Dirichlet partitioners."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.client.partition import dirichlet_partition, iid_partition, label_histogram

seeds = st.integers(min_value=0, max_value=2**32 - 1)


def _assert_exact_cover(parts: list[npt.NDArray[np.int64]], n_samples: int) -> None:
    assert all(part.dtype == np.int64 for part in parts)
    joined = np.concatenate(parts)
    assert joined.size == n_samples  # with the sort below: disjoint and complete
    np.testing.assert_array_equal(np.sort(joined), np.arange(n_samples))


@st.composite
def labelled(draw: st.DrawFn) -> tuple[npt.NDArray[np.int64], int]:
    """Labels over up to 6 classes and a partition count that min_size=1 allows."""
    n_classes = draw(st.integers(1, 6))
    labels = draw(st.lists(st.integers(0, n_classes - 1), min_size=1, max_size=300))
    num_partitions = draw(st.integers(1, min(8, len(labels))))
    return np.array(labels, dtype=np.int64), num_partitions


@given(n_samples=st.integers(1, 2000), data=st.data(), seed=seeds)
def test_iid_is_an_exact_balanced_cover(n_samples: int, data: st.DataObject, seed: int) -> None:
    num_partitions = data.draw(st.integers(1, min(n_samples, 50)))
    parts = iid_partition(n_samples, num_partitions, seed)
    assert len(parts) == num_partitions
    _assert_exact_cover(parts, n_samples)
    sizes = [part.size for part in parts]
    assert max(sizes) - min(sizes) <= 1
    for part, again in zip(parts, iid_partition(n_samples, num_partitions, seed), strict=True):
        np.testing.assert_array_equal(part, again)


def test_iid_depends_on_the_seed() -> None:
    a = iid_partition(1000, 4, seed=1)
    b = iid_partition(1000, 4, seed=2)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@settings(max_examples=60, deadline=None)
@given(case=labelled(), alpha=st.floats(0.05, 100.0), seed=seeds)
def test_dirichlet_is_an_exact_deterministic_cover(
    case: tuple[npt.NDArray[np.int64], int], alpha: float, seed: int
) -> None:
    labels, num_partitions = case
    try:
        parts = dirichlet_partition(labels, num_partitions, alpha, seed, min_size=1)
    except ValueError as exc:  # tiny, skewed draws may legitimately be unsatisfiable
        assert "tries" in str(exc)
        return
    assert len(parts) == num_partitions
    assert min(part.size for part in parts) >= 1
    _assert_exact_cover(parts, labels.size)
    again = dirichlet_partition(labels, num_partitions, alpha, seed, min_size=1)
    for part, other in zip(parts, again, strict=True):
        np.testing.assert_array_equal(part, other)
    hist = label_histogram(labels, parts)
    np.testing.assert_array_equal(hist.sum(axis=0), np.bincount(labels))


def _skew(labels: npt.NDArray[np.int64], parts: list[npt.NDArray[np.int64]]) -> float:
    """Mean total-variation distance between each partition's and the global label mix."""
    hist = label_histogram(labels, parts).astype(float)
    local = hist / hist.sum(axis=1, keepdims=True)
    overall = np.bincount(labels) / labels.size
    return float(np.mean(0.5 * np.abs(local - overall).sum(axis=1)))


@settings(max_examples=20, deadline=None)
@given(seed=seeds)
def test_smaller_alpha_means_more_skew(seed: int) -> None:
    labels = np.repeat(np.arange(10), 200)
    skewed = _skew(labels, dirichlet_partition(labels, 10, 0.1, seed, min_size=5))
    balanced = _skew(labels, dirichlet_partition(labels, 10, 100.0, seed, min_size=5))
    # Expected values are about 0.7 and 0.05: a wide margin for any seed.
    assert skewed > balanced + 0.3
    assert skewed > 0.4 and balanced < 0.2


def test_min_size_is_enforced_or_reported() -> None:
    labels = np.repeat(np.arange(10), 50)
    parts = dirichlet_partition(labels, 10, 0.3, seed=0, min_size=20)
    assert min(part.size for part in parts) >= 20
    with pytest.raises(ValueError, match=r"in 3 tries"):
        dirichlet_partition(labels, 10, 0.01, seed=0, min_size=49, max_tries=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, "alpha must be a positive"),
        ({"alpha": float("nan")}, "alpha must be a positive"),
        ({"num_partitions": 0}, "num_partitions must be >= 1"),
        ({"num_partitions": 11}, "cannot split 10 samples"),
        ({"min_size": 6}, "min_size=6 is impossible"),
        ({"max_tries": 0}, "max_tries"),
        ({"labels": np.zeros((2, 5), np.int64)}, "one-dimensional"),
        ({"labels": np.linspace(0, 1, 10)}, "integers"),
        ({"labels": -np.ones(10, np.int64)}, "non-negative"),
    ],
)
def test_dirichlet_rejects_bad_arguments(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "labels": np.arange(10) % 2,
        "num_partitions": 2,
        "alpha": 0.5,
        "seed": 0,
        "min_size": 1,
    }
    with pytest.raises(ValueError, match=message):
        dirichlet_partition(**{**args, **kwargs})  # type: ignore[arg-type]


def test_iid_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="cannot split 3 samples into 4"):
        iid_partition(3, 4, seed=0)


def test_label_histogram_counts() -> None:
    labels = np.array([0, 1, 1, 2, 2, 2])
    parts = [np.array([0, 1], np.int64), np.array([2, 3, 4, 5], np.int64)]
    np.testing.assert_array_equal(label_histogram(labels, parts), [[1, 1, 0], [0, 1, 3]])
    assert label_histogram(labels, parts, num_classes=5).shape == (2, 5)
    with pytest.raises(ValueError, match="labels go up to 2"):
        label_histogram(labels, parts, num_classes=2)
