"""Properties of the IID and Dirichlet partitioners, and of the simulator's partition file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.client.app import ClientContext
from geofl.client.partition import (
    PARTITION_FILE_FORMAT,
    PARTITION_FILE_KEY,
    PartitionFileError,
    assigned_indices,
    dirichlet_partition,
    iid_partition,
    label_histogram,
    read_partition_file,
    write_partition_file,
)

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


def _client(path: Path | str | int, client: Any = 0, **extra: Any) -> ClientContext:
    node = {
        PARTITION_FILE_KEY: path if isinstance(path, int) else str(path),
        "partition-id": client,
    }
    return ClientContext(node_id=1, node_name="c", node_config={**node, **extra})


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 30), min_size=1, max_size=12), seed=seeds)
def test_partition_file_round_trips_every_share(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], seed: int
) -> None:
    order = np.random.default_rng(seed).permutation(sum(sizes)).astype(np.int64)
    parts = np.split(order, np.cumsum(sizes)[:-1])
    path = tmp_path_factory.mktemp("plan") / "partition.npz"
    write_partition_file(path, parts)
    assert read_partition_file(path).num_clients == len(sizes)
    for client, part in enumerate(parts):
        share = assigned_indices(_client(path, client, **{"num-partitions": len(sizes)}))
        assert share is not None and share.dtype == np.int64
        np.testing.assert_array_equal(share, part)


def test_no_partition_file_means_the_app_splits_itself() -> None:
    context = ClientContext(node_id=1, node_name="c", node_config={"partition-id": 0})
    assert assigned_indices(context) is None


def test_the_file_is_read_once_per_process_until_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    write_partition_file(path, [np.arange(3), np.arange(3, 5)])
    first = read_partition_file(path)
    assert read_partition_file(str(path)) is first  # 10,000 clients, one read
    share = assigned_indices(_client(path, 0))
    assert share is not None
    share[:] = -1  # a client scribbling on its share leaves the cached file intact
    np.testing.assert_array_equal(read_partition_file(path).share(0), [0, 1, 2])
    write_partition_file(path, [np.arange(5)])
    assert read_partition_file(path).num_clients == 1


def test_shares_may_not_be_written_by_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    write_partition_file(path, [np.arange(4)])
    with pytest.raises(ValueError, match="read-only"):
        read_partition_file(path).indices[0] = 7


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"partition-id": 2}, r"partition-id 2 is outside 0\.\.1"),
        ({"partition-id": -1}, r"partition-id -1 is outside 0\.\.1"),
        ({"partition-id": "0"}, "partition-id must be an integer"),
        ({"partition-id": True}, "partition-id must be an integer"),
        ({"partition-id": 0, "num-partitions": 3}, "among 2 clients but .* num-partitions=3"),
    ],
)
def test_assigned_indices_rejects_a_client_the_file_does_not_know(
    tmp_path: Path, node: dict[str, Any], message: str
) -> None:
    path = tmp_path / "p.npz"
    write_partition_file(path, [np.arange(3), np.arange(3, 5)])
    with pytest.raises(PartitionFileError, match=message):
        assigned_indices(_client(path, **node))


def test_a_missing_file_says_who_writes_it(tmp_path: Path) -> None:
    with pytest.raises(PartitionFileError, match=r"gone\.npz cannot be read .*moved or deleted"):
        assigned_indices(_client(tmp_path / "gone.npz"))
    with pytest.raises(PartitionFileError, match="must be a path, got 3"):
        assigned_indices(_client(3))


class _Boom:
    """Unpickling this would run code; the reader must refuse before that."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, ("exit 1",))


def _npz(path: Path, **arrays: Any) -> Path:
    with path.open("wb") as stream:
        np.savez(stream, **arrays)
    return path


GOOD: dict[str, Any] = {
    "format": np.int64(PARTITION_FILE_FORMAT),
    "indices": np.arange(4, dtype=np.int64),
    "offsets": np.array([0, 2, 4], dtype=np.int64),
}


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"indices": GOOD["indices"]}, "is not a partition file: it holds"),
        ({**GOOD, "extra": np.zeros(1)}, "is not a partition file: it holds"),
        ({**GOOD, "format": np.int64(2)}, "format 2, this geofl reads format 1"),
        ({**GOOD, "format": np.array("1")}, "format '1'"),
        ({**GOOD, "indices": np.arange(4, dtype=np.int32)}, "expected int64"),
        ({**GOOD, "indices": np.arange(4, dtype=np.int64).reshape(2, 2)}, "one-dimensional"),
        ({**GOOD, "offsets": np.array([0], dtype=np.int64)}, "at least one client"),
        ({**GOOD, "offsets": np.array([0, 3, 2, 4], dtype=np.int64)}, "must rise from 0 to 4"),
        ({**GOOD, "offsets": np.array([1, 4], dtype=np.int64)}, "must rise from 0 to 4"),
        ({**GOOD, "offsets": np.array([0, 5], dtype=np.int64)}, "must rise from 0 to 4"),
        ({**GOOD, "indices": np.array([0, 1, -2, 3], dtype=np.int64)}, "non-negative"),
        (
            {**GOOD, "indices": np.array([_Boom()], dtype=object)},
            "not a readable partition file: .*allow_pickle=False",
        ),
    ],
)
def test_corrupt_files_are_refused(tmp_path: Path, arrays: dict[str, Any], message: str) -> None:
    path = _npz(tmp_path / "bad.npz", **arrays)
    with pytest.raises(PartitionFileError, match=message):
        assigned_indices(_client(path))


@pytest.mark.parametrize("content", [b"", b"not a zip file", b"PK\x03\x04truncated"])
def test_files_that_are_not_npz_are_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.npz"
    path.write_bytes(content)
    with pytest.raises(PartitionFileError, match="not a readable partition file"):
        read_partition_file(path)


def test_a_single_npy_array_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.npz"
    with path.open("wb") as stream:
        np.save(stream, np.arange(4))
    with pytest.raises(PartitionFileError, match=r"not an \.npz archive"):
        read_partition_file(path)


def test_a_truncated_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.npz"
    write_partition_file(path, [np.arange(1000), np.arange(1000, 2000)])
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(PartitionFileError, match="not a readable partition file"):
        read_partition_file(path)


def test_writing_needs_one_dimensional_shares(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one client"):
        write_partition_file(tmp_path / "p.npz", [])
    with pytest.raises(ValueError, match="one-dimensional"):
        write_partition_file(tmp_path / "p.npz", [np.zeros((2, 2), np.int64)])
    assert list(tmp_path.iterdir()) == []
