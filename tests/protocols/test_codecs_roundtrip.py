"""Every codec against an exact reference, across dtypes and shapes, with stated tolerances.

Tolerances: fp16 and bf16 match an independent rounding reference bit for bit (so
relative error <= 2**-11 and 2**-8 in the normal range); qsgd errs by at most one grid
step ``max|x_block| / s`` (half a step with nearest rounding) plus the output dtype's
rounding; topk equals the reference "k largest |x|, lower index on ties" exactly.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.protocols.codecs import (
    Chain,
    CodecStep,
    decode_tensor,
    encode_tensor,
    estimate_bytes,
    parse_chain,
)
from geofl.protocols.codecs.wire import parse

from .test_codecs_strategies import CODEC_CONFIGS, chain, seeds, tensors

F64 = npt.NDArray[np.float64]
#: Unit roundoff of the decoded output, by input dtype (codecs compute in float32).
UNIT = {"float16": 2.0**-11, "float32": 2.0**-24, "float64": 2.0**-24}


def roundtrip(x: npt.NDArray[Any], steps: Chain, seed: int = 0) -> tuple[bytes, npt.NDArray[Any]]:
    payload = encode_tensor(x, steps, seed=seed)
    return payload, decode_tensor(payload, steps, x.dtype.name, x.shape)


@settings(deadline=None, max_examples=150)
@given(tensors(), st.sampled_from(sorted(CODEC_CONFIGS)), seeds)
def test_round_trip_keeps_dtype_shape_size_estimate_and_determinism(
    x: npt.NDArray[np.floating], label: str, seed: int
) -> None:
    steps = chain(label)
    payload, y = roundtrip(x, steps, seed)
    assert y.dtype == x.dtype and y.shape == x.shape and y.flags.writeable
    assert np.isfinite(y).all()
    estimate = estimate_bytes(x.dtype.name, x.shape, steps)
    if any(step.name == "topk" for step in steps):
        assert len(payload) <= estimate
    else:
        assert len(payload) == estimate
    assert encode_tensor(x.copy(), steps, seed=seed) == payload


@given(tensors())
def test_none_is_exact(x: npt.NDArray[np.floating]) -> None:
    _, y = roundtrip(x, chain("none"))
    np.testing.assert_array_equal(y, x)


@given(tensors())
def test_fp16_equals_numpy_cast_and_relative_bound(x: npt.NDArray[np.floating]) -> None:
    _, y = roundtrip(x, chain("fp16"))
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(x.dtype))
    exact = x.astype(np.float64)
    assert (np.abs(y - exact) <= 2.0**-11 * np.abs(exact) + 2.0**-25).all()


def as_float(bits: npt.NDArray[np.uint64]) -> F64:
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def bf16_reference(x: npt.NDArray[np.floating]) -> F64:
    """Nearest of the two bf16 neighbours of float32(x), ties to the even one."""
    bits = np.array(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    down = bits & np.uint64(0xFFFF0000)
    up = down + np.uint64(0x10000)
    value = x.astype(np.float32).astype(np.float64)
    dist_down, dist_up = np.abs(value - as_float(down)), np.abs(as_float(up) - value)
    even_up = ((up >> np.uint64(16)) & np.uint64(1)) == 0
    take_up = (dist_up < dist_down) | ((dist_up == dist_down) & even_up)
    return np.where(take_up, as_float(up), as_float(down))


@given(tensors())
def test_bf16_equals_independent_reference(x: npt.NDArray[np.floating]) -> None:
    _, y = roundtrip(x, chain("bf16"))
    np.testing.assert_array_equal(y, bf16_reference(x).astype(x.dtype))
    if x.dtype != np.float16:
        exact = x.astype(np.float64)
        assert (np.abs(y - exact) <= (2.0**-8 + 2.0**-23) * np.abs(exact) + 2.0**-133).all()


def test_bf16_rounds_ties_to_even() -> None:
    # 1 + 2**-8 is halfway between bf16 neighbours 1 and 1 + 2**-7: tie goes to 1 (even).
    # 1 + 3 * 2**-8 is halfway between 1 + 2**-7 (odd) and 1 + 2**-6: goes up.
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8)], dtype=np.float32)
    _, y = roundtrip(x, chain("bf16"))
    np.testing.assert_array_equal(y, [1.0, 1 + 2.0**-6, -1.0])


def block_scales(x: npt.NDArray[np.floating], block: int) -> F64:
    """max |x| of each element's block, per element (float64)."""
    flat = np.abs(x.astype(np.float32).astype(np.float64)).reshape(-1)
    padded = np.zeros(-(-flat.size // block) * block)
    padded[: flat.size] = flat
    per_block = padded.reshape(-1, block).max(axis=1, initial=0.0)
    return np.repeat(per_block, block)[: flat.size]


@settings(deadline=None)
@given(
    tensors(),
    st.sampled_from([8, 4, 2]),
    st.sampled_from([8, 16, 64]),
    st.booleans(),
    seeds,
)
def test_qsgd_error_within_grid_step(
    x: npt.NDArray[np.floating], bits: int, block: int, stochastic: bool, seed: int
) -> None:
    steps = (CodecStep("qsgd", {"bits": bits, "block": block, "stochastic": stochastic}),)
    _, y = roundtrip(x, steps, seed)
    levels = 2 ** (bits - 1) - 1
    scale = block_scales(x, block)
    step = scale / levels
    working = x.astype(np.float32).astype(np.float64)  # codecs compute in float32 (documented)
    error = np.abs(y.astype(np.float64) - working).reshape(-1)
    allowed = (1.0 if stochastic else 0.5) * step + (UNIT[x.dtype.name] + 1e-6) * scale
    assert (error <= allowed + 1e-300).all()
    if x.dtype != np.float16:
        grid = np.divide(
            y.astype(np.float64).reshape(-1), step, where=step > 0, out=np.zeros(y.size)
        )
        assert np.allclose(grid, np.round(grid), atol=1e-3)
        assert (np.abs(np.round(grid)) <= levels).all()


def topk_reference(x: npt.NDArray[np.floating], k: int) -> F64:
    flat = x.astype(np.float64).reshape(-1)
    order = np.lexsort((np.arange(flat.size), -np.abs(flat)))
    out = np.zeros_like(flat)
    keep = order[: min(k, flat.size)]
    out[keep] = flat[keep]
    return out.reshape(x.shape)


@given(tensors(), st.integers(1, 40))
def test_topk_keeps_exactly_the_k_largest(x: npt.NDArray[np.floating], k: int) -> None:
    _, y = roundtrip(x, (CodecStep("topk", {"k": k}),))
    np.testing.assert_array_equal(y, topk_reference(x, k))


def test_topk_ties_go_to_lower_indices_and_ratio_rounds_up() -> None:
    x = np.array([1.0, -3.0, 3.0, 0.0, 3.0, 2.0], dtype=np.float32)
    _, y = roundtrip(x, (CodecStep("topk", {"k": 2}),))
    np.testing.assert_array_equal(y, [0, -3, 3, 0, 0, 0])
    _, y = roundtrip(x, (CodecStep("topk", {"ratio": 0.4}),))  # ceil(2.4) = 3
    np.testing.assert_array_equal(y, [0, -3, 3, 0, 3, 0])


def randk_reference_indices(seed: int, n: int, k: int) -> npt.NDArray[np.intp]:
    """The documented rule, with a full sort instead of a partition."""
    raw = np.random.PCG64(seed).random_raw(n)
    shift = np.uint64(max(1, (n - 1).bit_length()))
    keys = ((raw >> shift) << shift) | np.arange(n, dtype=np.uint64)
    return np.sort(np.argsort(keys, kind="stable")[:k])


@settings(deadline=None)
@given(tensors(("float32", "float64")), st.sampled_from([0.1, 0.5, 1.0]), st.booleans(), seeds)
def test_randk_matches_documented_index_rule(
    x: npt.NDArray[np.floating], ratio: float, unbiased: bool, seed: int
) -> None:
    steps = (CodecStep("randk", {"ratio": ratio, "unbiased": unbiased}),)
    payload, y = roundtrip(x, steps, seed)
    n = x.size
    if n == 0:
        return
    k = min(n, max(1, int(np.ceil(round(ratio * n, 6)))))
    (_, arrays) = parse(payload)
    keep = randk_reference_indices(int(arrays["x.s0.seed"][0]), n, k)
    expected = np.zeros(n)
    expected[keep] = x.reshape(-1)[keep].astype(np.float64) * (n / k if unbiased else 1.0)
    # The scaling happens in the tensor's dtype: a subnormal result keeps only its absolute
    # precision (one subnormal step), which no relative tolerance covers.
    tiny = float(np.finfo(x.dtype).smallest_subnormal) if x.dtype.kind == "f" else 0.0
    np.testing.assert_allclose(y.reshape(-1), expected, rtol=1e-6, atol=tiny)


@given(tensors(), st.sampled_from([0, 8, 16]))
def test_sign_is_mean_magnitude_times_sign(x: npt.NDArray[np.floating], block: int) -> None:
    _, y = roundtrip(x, (CodecStep("sign", {"block": block}),))
    flat = x.astype(np.float32).astype(np.float64).reshape(-1)
    size = block or max(flat.size, 1)
    padded = np.zeros(-(-flat.size // size) * size)
    padded[: flat.size] = np.abs(flat)
    sums = padded.reshape(-1, size).sum(axis=1)
    counts = np.minimum(size, flat.size - size * np.arange(sums.size))
    scale = np.repeat(sums / np.maximum(counts, 1), size)[: flat.size]
    expected = np.where(flat < 0, -scale, scale)
    # The result is cast back to x's dtype (and the codec computes in float32): among
    # subnormals the spacing is a fixed step, not a relative one.
    atol = max(
        float(np.finfo(np.float32).smallest_subnormal),
        float(np.finfo(x.dtype).smallest_subnormal),
    )
    np.testing.assert_allclose(y.reshape(-1), expected, rtol=1e-5 + UNIT[x.dtype.name], atol=atol)


@settings(deadline=None)
@given(tensors(("float32", "float64")), seeds)
def test_topk_then_qsgd8_is_topk_within_a_step(x: npt.NDArray[np.floating], seed: int) -> None:
    steps = parse_chain([{"topk": {"k": 6}}, {"qsgd": {"bits": 8, "block": 8}}])
    _, y = roundtrip(x, steps, seed)
    reference = topk_reference(x, 6).astype(np.float32).astype(np.float64)  # float32 work
    kept = reference != 0
    assert not (y[~kept]).any()
    bound = np.abs(reference).max(initial=0.0) / 127 * (1 + 1e-5)
    assert (np.abs(y - reference) <= bound).all()


def test_chain_of_none_steps_and_empty_chain_are_exact() -> None:
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    for steps in ((), parse_chain(["none", "none"]), chain("qsgd8")):
        _, y = roundtrip(x, steps)
        np.testing.assert_array_equal(y, x)  # integer tensors pass lossy codecs untouched


def test_different_seeds_give_different_stochastic_bytes() -> None:
    x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    for label in ("qsgd8", "qsgd4", "randk"):
        assert encode_tensor(x, chain(label), seed=1) != encode_tensor(x, chain(label), seed=2)
    nearest = parse_chain({"qsgd": {"bits": 8, "stochastic": False}})
    assert encode_tensor(x, nearest, seed=1) == encode_tensor(x, nearest, seed=2)


GOLDEN_DIGESTS = {
    "qsgd8": "6e75995bee8ec408",
    "qsgd2": "e967fa6c5d1b5fb9",
    "topk": "a9e860548762bfd3",
    "randk": "18ce3ef8c3db23cd",
    "bf16": "42889be234e007be",
    "sign-block": "df96567f215b0909",
}


@pytest.mark.parametrize("label", sorted(GOLDEN_DIGESTS))
def test_bytes_are_pinned(label: str) -> None:
    """Same input, chain and seed give these exact bytes (format and RNG use are frozen)."""
    x = np.linspace(-3, 5, 1001, dtype=np.float32).reshape(7, 143)
    payload = encode_tensor(x, chain(label), seed=12345)
    assert hashlib.sha256(payload).hexdigest()[:16] == GOLDEN_DIGESTS[label]


def test_a_chain_with_parameters_survives_pickling_to_a_worker_process() -> None:
    """The virtual clock's worker processes receive chains over their local pipes."""
    import pickle

    chain = parse_chain([{"topk": {"ratio": 0.5}}, {"qsgd": {"bits": 4}}])
    copy = pickle.loads(pickle.dumps(chain))
    assert copy == chain
    assert dict(copy[1].params) == dict(chain[1].params)
