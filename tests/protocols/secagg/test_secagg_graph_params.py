"""The seeded Harary neighbour graph, the parameter helpers and SecAggParams validation."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.secagg import (
    SecAggError,
    SecAggParams,
    graph_degree,
    neighbours,
    recommended_degree,
    recommended_threshold,
)

SEED = b"s" * 32


def _connected(graph: dict[int, frozenset[int]]) -> bool:
    start = next(iter(graph))
    seen, frontier = {start}, [start]
    while frontier:
        for peer in graph[frontier.pop()] - seen:
            seen.add(peer)
            frontier.append(peer)
    return len(seen) == len(graph)


@settings(max_examples=80, deadline=None)
@given(
    cohort=st.lists(st.integers(1, 2**64 - 1), min_size=2, max_size=40, unique=True),
    degree=st.integers(2, 45),
    seed=st.binary(min_size=16, max_size=32),
)
def test_graph_is_regular_symmetric_connected_and_deterministic(
    cohort: list[int], degree: int, seed: bytes
) -> None:
    graph = neighbours(cohort, degree, seed)
    expected = graph_degree(len(cohort), degree)
    assert set(graph) == set(cohort)
    for node, peers in graph.items():
        assert node not in peers
        assert len(peers) == expected
        assert all(node in graph[peer] for peer in peers)
    assert _connected(graph)
    assert neighbours(list(reversed(cohort)), degree, seed) == graph


def test_degree_rounding_and_complete_graph() -> None:
    assert graph_degree(10, 4) == 4
    assert graph_degree(10, 5) == 5  # odd degree, even n: the antipodal edge
    assert graph_degree(11, 5) == 6  # odd degree, odd n: impossible, rounded up
    assert graph_degree(10, 9) == 9 and graph_degree(10, 50) == 9
    assert graph_degree(2, 1) == 1
    with pytest.raises(SecAggError, match="pairs"):
        graph_degree(4, 1)
    graph = neighbours(range(1, 11), 50, SEED)
    assert all(peers == frozenset(range(1, 11)) - {node} for node, peers in graph.items())


def test_the_seed_decides_the_graph() -> None:
    cohort = list(range(1, 31))
    assert neighbours(cohort, 4, b"a" * 16) != neighbours(cohort, 4, b"b" * 16)


def test_recommended_degree_grows_logarithmically() -> None:
    assert recommended_degree(2) == 1
    assert recommended_degree(10) == 9  # small cohorts: the complete graph
    assert recommended_degree(100) == 20
    assert recommended_degree(10**6) == 60
    degrees = [recommended_degree(n) for n in range(2, 5000, 7)]
    assert degrees == sorted(degrees)


def test_recommended_threshold_is_a_clamped_majority_of_holders() -> None:
    assert recommended_threshold(9) == 6  # 10 holders -> 6
    assert recommended_threshold(10) == 6  # 11 holders -> 6
    assert recommended_threshold(1) == 2
    assert recommended_threshold(9, 2 / 3) == 7
    assert recommended_threshold(9, 0.99) == 10
    with pytest.raises(SecAggError, match="fraction"):
        recommended_threshold(9, 1.0)


def _params(**changes: Any) -> SecAggParams:
    base: dict[str, Any] = {
        "run_id": 1,
        "round": 2,
        "cohort": (3, 1, 2, 4, 5),
        "threshold": 3,
        "degree": 2,
        "graph_seed": SEED,
        "clip": 1,
        "ring_bits": 16,
    }
    return SecAggParams(**{**base, **changes})


def test_params_normalise_cohort_and_clip() -> None:
    params = _params()
    assert params.cohort == (1, 2, 3, 4, 5)
    assert params.clip == 1.0 and isinstance(params.clip, float)
    assert params.effective_degree == 2
    assert params.quantizer().cohort == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.threshold = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cohort": (1, 2, 2, 3)}, r"duplicate node ids in the cohort: \[2\]"),
        ({"cohort": (0, 1, 2)}, "node id 0"),
        ({"cohort": (1, "2")}, "node id '2'"),
        ({"cohort": (1,), "threshold": 2}, "at least 2 clients"),
        ({"cohort": "12"}, "tuple of node ids"),
        ({"threshold": 1}, r"threshold must be an int in 2..3"),
        ({"threshold": 4}, r"threshold must be an int in 2..3"),
        ({"degree": 50, "threshold": 6}, r"threshold must be an int in 2..5"),
        ({"degree": 0}, "degree must be an int >= 1"),
        ({"graph_seed": b"short"}, "graph_seed"),
        ({"run_id": -1}, "run_id"),
        ({"round": 2**64}, "round"),
        ({"clip": 0.0}, "clip"),
        ({"clip": float("inf")}, "clip"),
        ({"ring_bits": 4}, "ring_bits"),
        ({"ring_bits": 8, "cohort": tuple(range(1, 300)), "degree": 4}, "8-bit ring"),
    ],
)
def test_bad_params_are_rejected(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(SecAggError, match=message):
        _params(**changes)
