"""Masks: pairwise masks cancel exactly in the sum; the self mask comes off exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import geofl.protocols.secagg as secagg
from geofl.protocols.secagg import (
    MASK_PURPOSE,
    SecAggError,
    agree,
    agreement_info,
    apply_pairwise_masks,
    apply_self_mask,
    generate_private_key,
    neighbours,
    public_bytes,
    ring_dtype,
)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(2, 9),
    degree=st.integers(2, 8),
    bits=st.integers(8, 32),
    length=st.integers(0, 200),
    seed=st.binary(min_size=16, max_size=16),
)
def test_pairwise_masks_of_the_whole_cohort_cancel_exactly(
    size: int, degree: int, bits: int, length: int, seed: bytes
) -> None:
    cohort = list(range(10, 10 + size))
    graph = neighbours(cohort, degree, seed)
    private = {node: generate_private_key() for node in cohort}
    total = np.zeros(length, ring_dtype(bits))
    for node in cohort:
        keys = {
            peer: agree(
                private[node],
                public_bytes(private[peer]),
                info=agreement_info(MASK_PURPOSE, 1, 1, node, peer),
            )
            for peer in graph[node]
        }
        masked = np.zeros(length, ring_dtype(bits))
        apply_pairwise_masks(masked, node, keys, bits)
        assert length < 8 or masked.any()  # each vector is really masked
        total += masked
    secagg.ring_reduce(total, bits)
    assert not total.any()


def test_self_mask_is_removed_exactly_and_results_stay_in_the_ring() -> None:
    values = np.array([0, 1, 4095, 17], np.uint16)
    masked = values.copy()
    apply_self_mask(masked, b"k" * 32, 12)
    assert not np.array_equal(masked, values) and int(masked.max()) < 4096
    apply_self_mask(masked, b"k" * 32, 12, remove=True)
    assert np.array_equal(masked, values)


def test_a_node_cannot_mask_with_itself() -> None:
    with pytest.raises(SecAggError, match="itself"):
        apply_pairwise_masks(np.zeros(2, np.uint16), 3, {3: b"k" * 32}, 16)


def test_package_exports_exist_and_cover_the_submodules() -> None:
    assert len(secagg.__all__) == len(set(secagg.__all__))
    for name in secagg.__all__:
        assert hasattr(secagg, name), name
    for module in (secagg.errors, secagg.params):
        assert set(module.__all__) <= set(secagg.__all__)
