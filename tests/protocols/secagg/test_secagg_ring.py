"""The ring and the fixed-point quantizer: no overflow, bounded error, unbiased rounding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols.secagg import RingQuantizer, SecAggError, check_ring_vector, ring_dtype


@pytest.mark.parametrize(
    ("bits", "dtype"), [(8, "uint8"), (9, "uint16"), (16, "uint16"), (17, "uint32"), (32, "uint32")]
)
def test_ring_elements_use_the_smallest_unsigned_dtype(bits: int, dtype: str) -> None:
    assert ring_dtype(bits) == np.dtype(dtype)


@pytest.mark.parametrize("bits", [7, 33, 0, True, 16.0])
def test_ring_bits_out_of_range_are_rejected(bits: int) -> None:
    with pytest.raises(SecAggError, match=r"ring_bits must be an int in 8..32"):
        ring_dtype(bits)


def test_ring_vectors_are_checked_for_dtype_shape_and_range() -> None:
    with pytest.raises(SecAggError, match="1-D uint32"):
        check_ring_vector(np.zeros(3, np.uint16), 20, "v")
    with pytest.raises(SecAggError, match="1-D uint16"):
        check_ring_vector(np.zeros((2, 2), np.uint16), 12, "v")
    with pytest.raises(SecAggError, match="outside the ring"):
        check_ring_vector(np.array([1, 4096], np.uint16), 12, "v")
    with pytest.raises(SecAggError, match="NumPy array"):
        check_ring_vector([1, 2], 12, "v")
    vector = np.array([0, 4095], np.uint16)
    assert check_ring_vector(vector, 12, "v") is vector


@settings(max_examples=80, deadline=None)
@given(bits=st.integers(8, 32), cohort=st.integers(1, 255))
def test_the_sum_of_a_full_cohort_never_wraps(bits: int, cohort: int) -> None:
    quantizer = RingQuantizer(1.0, bits, cohort)
    top = quantizer.levels - 1
    assert top >= 1
    assert cohort * top < 2**bits <= cohort * (top + 1)  # the largest such level count
    ones = quantizer.encode(np.full(4, 1.0), np.random.default_rng(0))
    assert ones.tolist() == [top] * 4
    total = (ones.astype(np.uint64) * cohort).astype(quantizer.dtype)
    assert np.allclose(quantizer.decode_sum(total, cohort), cohort * 1.0)


@settings(max_examples=60, deadline=None)
@given(
    bits=st.integers(10, 32),
    clip=st.floats(0.01, 100.0),
    vectors=hnp.arrays(
        np.float64, st.tuples(st.integers(1, 6), st.integers(0, 30)), elements=st.floats(-200, 200)
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_decoded_sum_is_within_count_steps_of_the_clipped_sum(
    bits: int, clip: float, vectors: np.ndarray, seed: int
) -> None:
    count = vectors.shape[0]
    quantizer = RingQuantizer(clip, bits, count + 2)
    rng = np.random.default_rng(seed)
    total = np.zeros(vectors.shape[1], quantizer.dtype)
    for row in vectors:
        total += quantizer.encode(row, rng)
    decoded = quantizer.decode_sum(total, count)
    exact = np.clip(vectors, -clip, clip).sum(axis=0)
    assert np.all(np.abs(decoded - exact) <= quantizer.error_bound(count) * (1 + 1e-9))


def test_stochastic_rounding_is_unbiased() -> None:
    quantizer = RingQuantizer(1.0, 8, 1)  # coarse: step = 2/255, so bias would show
    step = quantizer.step
    x = -1.0 + step * np.array([0.1, 0.25, 0.5, 0.9, 7.3, 100.62, 254.99])
    draws = 4000
    rng = np.random.default_rng(1234)
    decoded = np.stack([quantizer.decode_sum(quantizer.encode(x, rng), 1) for _ in range(draws)])
    standard_error = step / 2 / np.sqrt(draws)  # rounding noise has std <= step / 2
    assert np.all(np.abs(decoded.mean(axis=0) - x) < 5 * standard_error)
    # Nearest rounding would be off by up to half a step, far beyond five standard errors.
    assert np.abs(np.round((x + 1) / step) * step - 1 - x).max() > 40 * standard_error


@pytest.mark.parametrize(
    ("clip", "bits", "cohort", "message"),
    [
        (0.0, 16, 2, "clip must be a finite number > 0"),
        (-1.0, 16, 2, "clip"),
        (float("nan"), 16, 2, "clip"),
        (1.0, 8, 256, "cannot be summed in a 8-bit ring"),
        (1.0, 16, 0, "cohort must be an int >= 1"),
        (1.0, 40, 2, "ring_bits"),
    ],
)
def test_bad_quantizer_parameters_are_rejected(
    clip: float, bits: int, cohort: int, message: str
) -> None:
    with pytest.raises(SecAggError, match=message):
        RingQuantizer(clip, bits, cohort)


def test_bad_vectors_and_sums_are_rejected() -> None:
    quantizer = RingQuantizer(1.0, 16, 4)
    rng = np.random.default_rng(0)
    with pytest.raises(SecAggError, match="NaN or Inf"):
        quantizer.encode(np.array([0.0, np.nan]), rng)
    with pytest.raises(SecAggError, match="NaN or Inf"):
        quantizer.encode(np.array([np.inf]), rng)
    with pytest.raises(SecAggError, match="floating-point"):
        quantizer.encode(np.array([1, 2]), rng)
    with pytest.raises(SecAggError, match=r"count must be an int in 1..4"):
        quantizer.decode_sum(np.zeros(2, np.uint16), 5)
    with pytest.raises(SecAggError, match="uint16"):
        quantizer.decode_sum(np.zeros(2, np.uint32), 2)
    too_big = np.array([2 * (quantizer.levels - 1) + 1], np.uint16)
    with pytest.raises(SecAggError, match="masks did not cancel"):
        quantizer.decode_sum(too_big, 2)
