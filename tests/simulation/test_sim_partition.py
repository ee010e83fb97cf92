"""Partition schemes of the simulator: exact covers, determinism, skew, errors, rendering."""

from __future__ import annotations

import io

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from geofl.client.partition import (
    PartitionError,
    dirichlet_partition,
    label_histogram,
    region_partition,
    require_data,
    shard_partition,
)
from geofl.server.config.simulation import PartitionConfig
from geofl.server.simulation.partition import (
    describe_partition,
    label_skew,
    partition_data,
    render_label_histogram,
)

seeds = st.integers(min_value=0, max_value=2**32 - 1)
TEN_CLASSES = np.repeat(np.arange(10), 100)


def _config(**scheme: object) -> PartitionConfig:
    return PartitionConfig.model_validate(scheme)


def _assert_exact_cover(parts: list[npt.NDArray[np.int64]], n_samples: int) -> None:
    assert all(part.dtype == np.int64 and part.size > 0 for part in parts)
    joined = np.concatenate(parts)
    assert joined.size == n_samples
    np.testing.assert_array_equal(np.sort(joined), np.arange(n_samples))


@st.composite
def split_inputs(draw: st.DrawFn) -> tuple[npt.NDArray[np.int64], int, list[str]]:
    n_classes = draw(st.integers(1, 6))
    labels = draw(st.lists(st.integers(0, n_classes - 1), min_size=4, max_size=400))
    num_clients = draw(st.integers(1, max(1, len(labels) // 4)))
    regions = draw(st.lists(st.sampled_from("abc"), min_size=num_clients, max_size=num_clients))
    return np.array(labels, dtype=np.int64), num_clients, regions


SCHEMES: list[dict[str, dict[str, float]]] = [
    {"iid": {}},
    {"dirichlet": {"alpha": 5.0}},
    {"shards": {"per_client": 2}},
    {"by_region": {"alpha": 5.0}},
]


@settings(max_examples=40, deadline=None)
@given(inputs=split_inputs(), seed=seeds, scheme=st.sampled_from(SCHEMES))
def test_every_scheme_is_a_deterministic_exact_cover(
    inputs: tuple[npt.NDArray[np.int64], int, list[str]],
    seed: int,
    scheme: dict[str, dict[str, float]],
) -> None:
    labels, num_clients, regions = inputs
    config = _config(**scheme)
    try:
        parts = partition_data(config, labels, num_clients, seed, regions)
    except PartitionError as exc:  # random draws on tiny inputs may starve a client
        assert config.scheme in ("dirichlet", "by_region"), exc
        assert "gets no samples" in str(exc) or "gave every partition" in str(exc)
        return
    assert len(parts) == num_clients
    _assert_exact_cover(parts, labels.size)
    again = partition_data(config, labels, num_clients, seed, regions)
    for part, same in zip(parts, again, strict=True):
        np.testing.assert_array_equal(part, same)


def test_the_seed_changes_the_split() -> None:
    for scheme in SCHEMES:
        config = _config(**scheme)
        regions = ["a", "b"] * 5
        a = partition_data(config, TEN_CLASSES, 10, 1, regions)
        b = partition_data(config, TEN_CLASSES, 10, 2, regions)
        assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True)), scheme


def test_dirichlet_skew_grows_as_alpha_falls() -> None:
    skews = [
        label_skew(label_histogram(TEN_CLASSES, dirichlet_partition(TEN_CLASSES, 10, a, 0, 1)))
        for a in (100.0, 1.0, 0.05)
    ]
    assert skews[0] < skews[1] < skews[2]
    assert skews[0] < 0.2 and skews[2] > 0.6


def test_shards_give_each_client_few_labels() -> None:
    parts = shard_partition(TEN_CLASSES, 50, 2, seed=3)  # 100 shards of 10, 10 per label
    histogram = label_histogram(TEN_CLASSES, parts)
    assert ((histogram > 0).sum(axis=1) <= 2).all()
    assert {part.size for part in parts} == {20}
    _assert_exact_cover(parts, TEN_CLASSES.size)


def test_by_region_skews_regions_and_keeps_regions_internally_iid() -> None:
    regions = ["eu"] * 10 + ["us"] * 10 + ["asia"] * 10
    labels = np.repeat(np.arange(10), 300)

    def region_skew(alpha: float) -> float:
        parts = region_partition(labels, regions, alpha, seed=0)
        hist = label_histogram(labels, parts)
        per_region = np.stack([hist[i : i + 10].sum(axis=0) for i in (0, 10, 20)])
        return label_skew(per_region)

    assert region_skew(0.05) > region_skew(100.0) + 0.3
    parts = region_partition(labels, regions, 0.3, seed=0)
    hist = label_histogram(labels, parts)
    eu = hist[:10]
    # Within a region the split is IID: every client's mix is close to the region's.
    share = eu / eu.sum(axis=1, keepdims=True)
    assert np.abs(share - eu.sum(axis=0) / eu.sum()).max() < 0.15


@pytest.mark.parametrize(
    ("scheme", "num_clients", "message"),
    [
        ({"iid": {}}, 1001, "more clients than samples"),
        (
            {"shards": {"per_client": 3}},
            400,
            r"shards\(per_client=3\) for 400 clients needs "
            "1200 shards but there are only 1000 samples",
        ),
        (
            {"dirichlet": {"alpha": 0.001}},
            200,
            r"partition dirichlet\(alpha=0.001\) of 1000 "
            "samples: no Dirichlet",
        ),
    ],
)
def test_impossible_splits_name_the_client_and_settings(
    scheme: dict[str, object], num_clients: int, message: str
) -> None:
    regions = ["a", "b"] * (num_clients // 2) + ["a"] * (num_clients % 2)
    with pytest.raises(PartitionError, match=message):
        partition_data(_config(**scheme), TEN_CLASSES, num_clients, 0, regions)


def test_a_region_left_without_data_is_named() -> None:
    one_label = np.zeros(1000, dtype=np.int64)  # all of it goes to one region or the other
    regions = ["a", "b"] * 150
    config = _config(by_region={"alpha": 1e-4})
    message = r"client \d+ \(region '[ab]'\) of 300 gets no samples with by_region\(alpha=0.0001\)"
    with pytest.raises(PartitionError, match=message):
        partition_data(config, one_label, 300, 0, regions)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="alpha must be a positive"):
        region_partition(TEN_CLASSES, ["a"] * 4, 0.0, seed=0)
    with pytest.raises(ValueError, match="alpha must be a positive"):
        region_partition(TEN_CLASSES, ["a"] * 4, -1.0, seed=0)
    with pytest.raises(ValueError, match="shards_per_client must be >= 1"):
        shard_partition(TEN_CLASSES, 4, 0, seed=0)
    with pytest.raises(ValueError, match="needs the region of each of the 4 clients"):
        partition_data(_config(by_region={"alpha": 1}), TEN_CLASSES, 4, 0)
    with pytest.raises(ValueError, match="got 2"):
        partition_data(_config(by_region={"alpha": 1}), TEN_CLASSES, 4, 0, ["a", "b"])
    with pytest.raises(ValueError, match="max_tries"):
        region_partition(TEN_CLASSES, ["a"], 1.0, seed=0, max_tries=0)


def test_require_data_names_the_first_empty_client() -> None:
    parts = [np.arange(3), np.zeros(0, np.int64), np.zeros(0, np.int64)]
    with pytest.raises(
        PartitionError,
        match=r"client 1 \(and 1 more\) of 3 gets no samples "
        "with my settings; do this",
    ):
        require_data(parts, "my settings", "do this")
    require_data(parts[:1], "x", "y")


def test_describe_partition() -> None:
    assert describe_partition(_config(iid={})) == "iid()"
    assert describe_partition(_config(shards={"per_client": 2})) == "shards(per_client=2)"
    assert describe_partition(_config(by_region={"alpha": 0.5})) == "by_region(alpha=0.5)"


def _render(table: object) -> str:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(table)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(text, str)
    return text


def test_histogram_table_lists_few_clients() -> None:
    hist = np.array([[5, 0, 1], [0, 7, 0]], dtype=np.int64)
    text = _render(render_label_histogram(hist))
    assert "client" in text and "total" in text
    lines = [line.split("│") for line in text.splitlines() if "│" in line]
    cells = [[c.strip() for c in line if c.strip()] for line in lines]
    assert ["0", "5", "0", "1", "6"] in cells
    assert ["1", "0", "7", "0", "7"] in cells
    assert "2 clients, mean top-label share 0.92" in " ".join(text.split())


def test_histogram_table_summarises_many_clients() -> None:
    hist = np.tile(np.array([[1, 2], [3, 4]], dtype=np.int64), (50, 1))
    text = _render(render_label_histogram(hist, max_rows=20))
    cells = [
        [c.strip() for c in line.split("│") if c.strip()]
        for line in text.splitlines()
        if "│" in line
    ]
    assert ["min", "1", "2", "3"] in cells
    assert ["median", "2", "3", "5"] in cells
    assert ["max", "3", "4", "7"] in cells
    assert ["total", "200", "300", "500"] in cells
    assert "100 clients" in " ".join(text.split())
    assert len(cells) < 10


def test_label_skew_bounds() -> None:
    assert label_skew(np.array([[5, 5], [2, 2]])) == 0.5
    assert label_skew(np.array([[5, 0], [0, 0]])) == 1.0
    assert label_skew(np.zeros((2, 3), dtype=np.int64)) == 0.0
