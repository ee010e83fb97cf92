"""SecAgg+ without temporaries: the fused and in-place paths give the old values exactly.

The client builds ``[w * delta, w]`` in one buffer, quantizes it in place and expands
every mask into one reused buffer; the server removes masks through one buffer too. Each
shortcut is pinned here to the straightforward computation it replaces.
"""

from __future__ import annotations

import numpy as np
import pytest

from geofl.client.secure_rounds import flatten, weighted_flat, weighted_vector
from geofl.protocols.secagg import (
    RingQuantizer,
    SecAggError,
    apply_pairwise_masks,
    apply_self_mask,
    expand,
    mask_buffer,
)
from geofl.protocols.tensors import Difference


def _delta() -> dict[str, Difference]:
    rng = np.random.default_rng(5)
    return {
        "w": Difference(
            rng.random((40, 9)).astype(np.float32), rng.random((40, 9)).astype(np.float32)
        ),
        "steps": Difference(
            np.arange(7, dtype=np.int64), np.arange(7, dtype=np.int64)[::-1].copy()
        ),
        "t": Difference(
            rng.random((9, 40)).astype(np.float32).T, rng.random((40, 9)).astype(np.float32)
        ),
        "none": Difference(np.zeros(0, np.float32), np.zeros(0, np.float32)),
    }


@pytest.mark.parametrize("weight", [1.0, 0.37, 1e-3])
def test_weighted_flat_is_flatten_then_weight_bit_for_bit(weight: float) -> None:
    delta = _delta()
    np.testing.assert_array_equal(
        weighted_flat(delta, weight), weighted_vector(flatten(delta), weight)
    )


def _reference_encode(q: RingQuantizer, x: np.ndarray, seed: int) -> np.ndarray:
    """The quantizer as it was: one float64 copy and one full array of uniform draws."""
    levels = np.clip(np.array(x, dtype=np.float64), -q.clip, q.clip) + q.clip
    levels *= 1.0 / q.step
    levels += np.random.default_rng(seed).random(levels.shape)
    return np.minimum(np.floor(levels), q.levels - 1).astype(q.dtype)


@pytest.mark.parametrize("size", [0, 1, 65_535, 65_536, 65_537, 200_003])
def test_quantizing_in_blocks_and_in_place_draws_the_same_stream(size: int) -> None:
    q = RingQuantizer(clip=2.0, ring_bits=32, cohort=50)
    x = np.random.default_rng(size).normal(size=size)
    expected = _reference_encode(q, x, seed=11)
    kept = x.copy()
    np.testing.assert_array_equal(q.encode(x, np.random.default_rng(11)), expected)
    np.testing.assert_array_equal(x, kept)  # the input is untouched


@pytest.mark.parametrize("clip", [1.0, 0.1])  # 0.1 is not a float32: clipping is in float64
def test_float32_and_strided_inputs_quantize_as_their_float64_copy(clip: float) -> None:
    q = RingQuantizer(clip=clip, ring_bits=16, cohort=3)
    x32 = np.linspace(-1, 1, 140_007, dtype=np.float32).reshape(7, -1)
    kept = x32.copy()
    out = q.encode(x32, np.random.default_rng(0))
    np.testing.assert_array_equal(x32, kept)
    assert out.shape == x32.shape and out.dtype == np.uint16
    np.testing.assert_array_equal(out, _reference_encode(q, x32, seed=0))
    strided = x32[:, ::2]
    np.testing.assert_array_equal(
        q.encode(strided, np.random.default_rng(5)), _reference_encode(q, strided, seed=5)
    )


@pytest.mark.parametrize("bits", [12, 16, 32])
def test_masks_through_one_buffer_equal_fresh_masks(bits: int) -> None:
    keys = {3: bytes(range(32)), 9: bytes(range(1, 33)), 1: bytes(range(2, 34))}
    rng = np.random.default_rng(bits)
    dtype = np.uint16 if bits <= 16 else np.uint32
    vector = (rng.integers(0, 1 << bits, 5000)).astype(dtype)
    fresh, reused = vector.copy(), vector.copy()
    apply_self_mask(fresh, keys[3], bits)
    apply_pairwise_masks(fresh, 5, keys, bits)
    buffer = mask_buffer(vector.size, bits)
    apply_self_mask(reused, keys[3], bits, buffer=buffer)
    apply_pairwise_masks(reused, 5, keys, bits, buffer=buffer)
    np.testing.assert_array_equal(reused, fresh)
    for key in keys.values():
        np.testing.assert_array_equal(
            expand(key, vector.size, bits, buffer=buffer), expand(key, vector.size, bits)
        )


def test_a_mask_buffer_too_small_is_refused() -> None:
    with pytest.raises(SecAggError, match="mask buffer"):
        expand(bytes(32), 100, 32, buffer=mask_buffer(99, 32))
    with pytest.raises(SecAggError, match="mask buffer"):
        expand(bytes(32), 10, 32, buffer=np.zeros(100, dtype=np.int8))  # type: ignore[arg-type]
