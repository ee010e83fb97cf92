"""The shared low-rank projection: linear (so it survives masking), exact where it must be."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.shared_lowrank import SharedLowRank, projection_of, vector_length
from geofl.protocols.tensors import TensorSpec, masked_length
from geofl.protocols.v1 import geofl_pb2 as pb

SPEC = (
    TensorSpec("w", "float32", (32, 64)),
    TensorSpec("b", "float32", (64,)),
    TensorSpec("conv", "float32", (8, 4, 3, 3)),
)


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in SPEC}


@given(seed=st.integers(0, 2**32 - 1), clients=st.integers(1, 6), rank=st.integers(1, 8))
@settings(max_examples=40, deadline=None)
def test_sum_of_projections_lifts_to_the_projection_of_the_sum(
    seed: int, clients: int, rank: int
) -> None:
    projection = SharedLowRank(rank, 100, seed.to_bytes(32, "little"))
    rng = np.random.default_rng(seed)
    updates = [_tensors(rng) for _ in range(clients)]
    summed = {t.name: sum(u[t.name].astype(np.float64) for u in updates) for t in SPEC}
    from_sum = projection.lift(projection.project(summed, SPEC), SPEC)
    lifted = projection.lift(sum(projection.project(u, SPEC) for u in updates), SPEC)
    for name in from_sum:
        np.testing.assert_allclose(lifted[name], from_sum[name], rtol=1e-9, atol=1e-9)


def test_small_and_thin_tensors_travel_whole_and_large_ones_shrink() -> None:
    projection = SharedLowRank(4, 1000, bytes(32))
    tensors = _tensors(np.random.default_rng(0))
    layout = {part.name: part for part in projection.layout(SPEC)}
    assert layout["w"].projected and layout["w"].length == 32 * 4
    assert not layout["b"].projected  # 1-D: no matrix to factor
    assert not layout["conv"].projected  # 288 elements < min_elements
    lifted = projection.lift(projection.project(tensors, SPEC), SPEC)
    np.testing.assert_array_equal(lifted["b"], tensors["b"].astype(np.float64))
    np.testing.assert_array_equal(lifted["conv"], tensors["conv"].astype(np.float64))
    assert projection.length(SPEC) == 32 * 4 + 64 + 288 < masked_length(SPEC) - 1


def test_projection_keeps_what_lies_in_the_shared_subspace() -> None:
    """A matrix whose rows lie in span(Q) is reproduced; the lift is an orthogonal projection."""
    projection = SharedLowRank(4, 1, b"s" * 32)
    q = projection.basis("w", 64)
    np.testing.assert_allclose(q.T @ q, np.eye(4), atol=1e-12)
    inside = np.random.default_rng(1).standard_normal((32, 4)) @ q.T
    lifted = projection.lift(
        projection.project({"w": inside, "b": np.zeros(64), "conv": np.zeros((8, 4, 3, 3))}, SPEC),
        SPEC,
    )
    np.testing.assert_allclose(lifted["w"], inside, atol=1e-12)
    assert not np.allclose(projection.basis("w", 64), SharedLowRank(4, 1, b"t" * 32).basis("w", 64))


def test_setup_decides_projection_and_length() -> None:
    plain = pb.SecAggSetup(graph_seed=bytes(32))
    assert projection_of(plain) is None
    assert vector_length(SPEC, plain) == masked_length(SPEC)
    sketched = pb.SecAggSetup(graph_seed=bytes(32), low_rank=4, low_rank_min_elements=1000)
    assert vector_length(SPEC, sketched) == 32 * 4 + 64 + 288 + 1


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="rank"):
        SharedLowRank(0, 1, bytes(32))
    with pytest.raises(ValueError, match="seed"):
        SharedLowRank(2, 1, b"short")
    with pytest.raises(ValueError, match="expected"):
        SharedLowRank(2, 1, bytes(32)).lift(np.zeros(3), SPEC)
