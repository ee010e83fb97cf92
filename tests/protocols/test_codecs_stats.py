"""Statistical and iterative properties: unbiasedness, PowerSGD convergence, error feedback.

Unbiasedness is tested as a z-test per element: the mean of ``T`` decodes (seeds
0..T-1) must lie within ``Z`` standard errors of ``x``, where the standard error uses
the worst-case variance (``step**2 / 4`` for stochastic rounding, ``x**2 (n/k - 1)``
for random-k).  With Z = 6 a correct codec fails an element with probability
< 2e-9, so the union over all elements tested stays below 1e-5; the seeds are fixed,
so a run is reproducible.  Each test also shows the check has power: the biased
variant (nearest rounding, unscaled random-k) fails it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from geofl.protocols.codecs import (
    Chain,
    CodecStep,
    ErrorFeedback,
    decode_tensor,
    encode_tensor,
    encode_with_feedback,
    parse_chain,
)

from .test_codecs_strategies import matrices_of_rank

Z = 6.0
F64 = npt.NDArray[np.float64]


def mean_decode(x: npt.NDArray[np.floating], steps: Chain, trials: int) -> F64:
    total = np.zeros(x.shape)
    for seed in range(trials):
        payload = encode_tensor(x, steps, seed=seed)
        total += decode_tensor(payload, steps, x.dtype.name, x.shape)
    return total / trials


def qsgd_is_unbiased(x: npt.NDArray[np.float32], bits: int, stochastic: bool, trials: int) -> bool:
    block = 16
    steps = (CodecStep("qsgd", {"bits": bits, "block": block, "stochastic": stochastic}),)
    padded = np.zeros(-(-x.size // block) * block)
    padded[: x.size] = np.abs(x)
    scale = np.repeat(padded.reshape(-1, block).max(axis=1), block)[: x.size]
    std_error = (scale / (2 ** (bits - 1) - 1)) / 2 / np.sqrt(trials)
    error = np.abs(mean_decode(x, steps, trials) - x)
    return bool((error <= Z * std_error + 1e-6 * scale + 1e-30).all())


@settings(deadline=None, max_examples=12)
@given(
    hnp.arrays(np.float32, st.integers(1, 40), elements=st.floats(-100, 100, width=32)),
    st.sampled_from([8, 4, 2]),
)
def test_qsgd_stochastic_is_unbiased(x: npt.NDArray[np.float32], bits: int) -> None:
    assert qsgd_is_unbiased(x, bits, stochastic=True, trials=400)


def test_qsgd_unbiasedness_check_has_power() -> None:
    x = np.linspace(-1, 1, 37, dtype=np.float32) + np.float32(0.013)
    for bits in (8, 4, 2):
        assert qsgd_is_unbiased(x, bits, stochastic=True, trials=1000)
        assert not qsgd_is_unbiased(x, bits, stochastic=False, trials=1000)


def randk_is_unbiased(x: npt.NDArray[np.float32], ratio: float, unbiased: bool) -> bool:
    trials, n = 3000, x.size
    k = max(1, int(np.ceil(round(ratio * n, 6))))
    steps = (CodecStep("randk", {"ratio": ratio, "unbiased": unbiased}),)
    std_error = np.abs(x) * np.sqrt((n / k - 1) / trials)
    error = np.abs(mean_decode(x, steps, trials) - x)
    return bool((error <= Z * std_error + 1e-6 * np.abs(x)).all())


def test_randk_unbiased_is_unbiased_and_plain_randk_is_not() -> None:
    x = np.random.default_rng(3).uniform(0.5, 2.0, 30).astype(np.float32)
    x[::3] *= -1
    assert randk_is_unbiased(x, 0.2, unbiased=True)
    assert not randk_is_unbiased(x, 0.2, unbiased=False)


def test_randk_keeps_each_index_with_probability_k_over_n() -> None:
    n, k, trials = 40, 8, 2000
    steps = (CodecStep("randk", {"k": k}),)
    x = np.ones(n, np.float32)
    hits = sum(
        decode_tensor(encode_tensor(x, steps, seed=s), steps, "float32", (n,))
        for s in range(trials)
    )
    p = k / n
    assert np.abs(hits / trials - p).max() <= Z * np.sqrt(p * (1 - p) / trials)


def powersgd(rank: int) -> Chain:
    return (CodecStep("powersgd", {"rank": rank}),)


def test_powersgd_is_exact_for_low_rank_matrices_and_conv_kernels() -> None:
    rng = np.random.default_rng(0)
    matrix = matrices_of_rank(rng, 40, 30, 3)
    kernel = matrices_of_rank(rng, 16, 8 * 3 * 3, 2).reshape(16, 8, 3, 3)
    for x, rank in ((matrix, 3), (matrix, 5), (kernel, 2), (kernel, 4)):
        state: dict[str, npt.NDArray[np.generic]] = {}
        for seed in range(3):  # warm-started: exact from the first step, and stays so
            payload = encode_tensor(x, powersgd(rank), seed=seed, state=state)
            y = decode_tensor(payload, powersgd(rank), "float32", x.shape)
            assert np.linalg.norm(y - x) <= 1e-4 * np.linalg.norm(x)
        assert [v.shape for v in state.values()] == [(int(np.prod(x.shape[1:])), rank)]


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation() -> None:
    rng = np.random.default_rng(1)
    left, _ = np.linalg.qr(rng.standard_normal((60, 60)))
    right, _ = np.linalg.qr(rng.standard_normal((50, 50)))
    spectrum = np.array([10, 8, 6, 5] + [1.0 / (i + 1) for i in range(46)])
    x = (left[:, :50] * spectrum @ right.T).astype(np.float32)
    optimal = np.sqrt((spectrum[4:] ** 2).sum())  # Eckart-Young: SVD truncation error
    state: dict[str, npt.NDArray[np.generic]] = {}
    for seed in range(30):
        warm = encode_tensor(x, powersgd(4), seed=seed, state=state)
    warm_error = np.linalg.norm(decode_tensor(warm, powersgd(4), "float32", x.shape) - x)
    cold = encode_tensor(x, powersgd(4), seed=99)
    cold_error = np.linalg.norm(decode_tensor(cold, powersgd(4), "float32", x.shape) - x)
    assert warm_error <= optimal * (1 + 1e-3)
    assert cold_error > optimal * 1.05  # the state is what makes it converge


def test_powersgd_passes_vectors_and_unprofitable_shapes_through_exactly() -> None:
    for shape in ((), (0,), (17,), (3, 2), (0, 5)):
        x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        y = decode_tensor(encode_tensor(x, powersgd(2), seed=0), powersgd(2), "float32", shape)
        np.testing.assert_array_equal(y, x)


def split_quadratic(pairs: int = 5) -> tuple[list[F64], F64]:
    """Two clients with a common optimum whose top-k updates cancel at the origin.

    Per coordinate pair, client 1 has Hessian [[a, b], [b, c]] and client 2
    [[a, -b], [-b, c]] (both positive definite, |b| > c); the optimum is (0, s).  At
    w = 0 both clients' largest gradient entries are +-b*s on the same coordinate, so
    averaged top-k updates are exactly zero and plain top-k never leaves the origin.
    """
    rng = np.random.default_rng(0)
    dim = 2 * pairs
    hessians = [np.zeros((dim, dim)), np.zeros((dim, dim))]
    optimum = np.zeros(dim)
    for j in range(pairs):
        b = rng.uniform(1.5, 2.5)
        block = slice(2 * j, 2 * j + 2)
        hessians[0][block, block] = [[b * b + 1, b], [b, 1]]
        hessians[1][block, block] = [[b * b + 1, -b], [-b, 1]]
        optimum[2 * j + 1] = rng.uniform(0.5, 1.5)
    return hessians, optimum


def federated_descent(steps: Chain, feedback: bool, rounds: int = 300, lr: float = 0.1) -> float:
    hessians, optimum = split_quadratic()
    w = np.zeros_like(optimum)
    memories = [ErrorFeedback() for _ in hessians]
    for round_ in range(rounds):
        received = []
        for hessian, memory in zip(hessians, memories, strict=True):
            update = -lr * hessian @ (w - optimum)
            if feedback:
                payload = encode_with_feedback(memory, "w", update, steps, seed=round_)
            else:
                payload = encode_tensor(update, steps, seed=round_)
            received.append(decode_tensor(payload, steps, "float64", w.shape))
        w = w + np.mean(received, axis=0)
    return float(np.linalg.norm(w - optimum))


def test_error_feedback_converges_where_plain_topk_stalls() -> None:
    _, optimum = split_quadratic()
    topk = parse_chain({"topk": {"ratio": 0.2}})
    assert federated_descent((), feedback=False) < 1e-8  # the problem itself is easy
    assert federated_descent(topk, feedback=False) > 0.99 * np.linalg.norm(optimum)
    assert federated_descent(topk, feedback=True) < 1e-6
    signs = parse_chain("sign")
    assert federated_descent(signs, feedback=True, rounds=600, lr=0.02) < 0.05
