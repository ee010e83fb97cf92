"""Central DP: clipped updates, a fixed denominator, Gaussian noise of the right std."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.privacy import GaussianClip, NoisedClippedMean, PrivacyError
from geofl.server.strategies import FedAvg
from geofl.server.strategies.robust import RobustStrategy

SPEC = {"w": np.zeros(4000, dtype=np.float32), "b": np.zeros(3, dtype=np.float64)}


def _update(rng: np.random.Generator, norm: float) -> dict[str, np.ndarray]:
    w = rng.normal(size=4000).astype(np.float32)
    b = rng.normal(size=3)
    total = float(np.sqrt(np.sum(w.astype(np.float64) ** 2) + np.sum(b**2)))
    return {"w": w * (norm / total), "b": b * (norm / total)}


def test_noise_std_is_noise_multiplier_times_clip_over_denominator() -> None:
    """Zero updates: what comes back is the noise alone; its std over 4003 coordinates and
    20 rounds matches z C / n to within 3 % (the sample std's error is ~0.2 % here)."""
    z, clip, n = 1.3, 0.5, 8
    rule = GaussianClip(clip, z, n, rng=np.random.default_rng(7))
    draws = []
    for _ in range(20):
        acc = rule.accumulator(SPEC)
        for _ in range(5):
            acc.add({"w": np.zeros(4000, np.float32), "b": np.zeros(3)}, 1.0)
        mean = acc.mean()
        draws.append(np.concatenate([mean["w"].astype(np.float64), mean["b"]]))
    values = np.concatenate(draws)
    expected = z * clip / n
    assert abs(float(values.std()) / expected - 1.0) < 0.03
    assert abs(float(values.mean())) < 0.05 * expected


def test_signal_is_the_clipped_sum_over_the_fixed_denominator() -> None:
    """Tiny noise: the mean is sum(clipped updates) / clients_per_round, not / arrived."""
    rng = np.random.default_rng(1)
    rule = GaussianClip(1.0, 1e-9, 10, rng=np.random.default_rng(2))
    acc = rule.accumulator(SPEC)
    updates = [_update(rng, norm) for norm in (0.5, 3.0, 1.0)]
    for update in updates:
        acc.add(update, 123.0)  # the weight (num_examples) is ignored
    mean = acc.mean()
    clipped_w = updates[0]["w"] + updates[1]["w"] / 3.0 + updates[2]["w"]
    np.testing.assert_allclose(mean["w"], clipped_w / 10, rtol=1e-5, atol=1e-7)
    assert acc.unclipped == 2


@settings(max_examples=40, deadline=None)
@given(
    norms=st.lists(st.floats(1e-3, 1e4), min_size=1, max_size=6),
    clip=st.floats(1e-2, 10.0),
)
def test_clipped_norms_never_exceed_the_bound(norms: list[float], clip: float) -> None:
    rng = np.random.default_rng(0)
    acc = NoisedClippedMean(SPEC, clip, 1.0, 4, np.random.default_rng(0))
    for norm in norms:
        check = acc.add(_update(rng, norm), 1.0)
        assert check.norm * check.scale <= clip * (1 + 1e-9)
        assert (check.scale < 1.0) == (check.norm > clip)
        if check.scale < 1.0:
            assert check.reason is not None and "dp_gaussian" in check.reason


def test_integer_tensors_are_refused() -> None:
    with pytest.raises(PrivacyError, match=r"\['steps'\]"):
        NoisedClippedMean({"steps": np.zeros(1, np.int64)}, 1.0, 1.0, 2, np.random.default_rng())


def test_adaptive_clip_norm_moves_with_the_noised_unclipped_share() -> None:
    """All updates far under the bound: the norm shrinks by about exp(-eta (1 - gamma))."""
    rng = np.random.default_rng(3)
    rule = GaussianClip(
        1.0,
        1.0,
        50,
        target_quantile=0.5,
        learning_rate=0.2,
        count_noise_multiplier=1e-6,
        rng=np.random.default_rng(4),
    )
    strategy = RobustStrategy(FedAvg(), rule)
    weights = {name: np.zeros_like(t) for name, t in SPEC.items()}
    acc = strategy.begin_round(weights)
    for _ in range(50):
        acc.add(_update(rng, 0.01), 1.0)
    strategy.apply(weights, acc.mean(), 1)
    assert rule.clip_norm == pytest.approx(np.exp(-0.2 * 0.5), rel=1e-6)
    state = strategy.state()
    fresh = GaussianClip(
        1.0, 1.0, 50, target_quantile=0.5, learning_rate=0.2, count_noise_multiplier=1.0
    )
    RobustStrategy(FedAvg(), fresh).load_state(state)
    assert fresh.clip_norm == rule.clip_norm


def test_half_set_adaptive_settings_are_refused() -> None:
    with pytest.raises(PrivacyError, match="together"):
        GaussianClip(1.0, 1.0, 4, target_quantile=0.5)


def test_default_generator_is_not_the_same_twice() -> None:
    """Cryptographically seeded: two rules draw different noise."""
    a, b = GaussianClip(1.0, 1.0, 1), GaussianClip(1.0, 1.0, 1)
    assert a.rng.normal() != b.rng.normal()


@settings(max_examples=30, deadline=None)
@given(norm=st.floats(1e-3, 1e5), clip=st.floats(1e-2, 10.0), denominator=st.integers(1, 50))
def test_what_one_update_contributes_is_within_the_clip_norm(
    norm: float, clip: float, denominator: int
) -> None:
    """Measured on the aggregate itself (noise 1e-12): one update moves the sum by <= C."""
    acc = NoisedClippedMean(SPEC, clip, 1e-12, denominator, np.random.default_rng(0))
    acc.add(_update(np.random.default_rng(1), norm), 1.0)
    mean = acc.mean()
    contribution = np.sqrt(sum(np.sum(np.asarray(t, np.float64) ** 2) for t in mean.values()))
    assert contribution * denominator <= clip * (1 + 1e-5)
    assert contribution * denominator == pytest.approx(min(norm, clip), rel=1e-4)


@settings(max_examples=30, deadline=None)
@given(
    norms=st.lists(st.floats(1e-3, 10.0), min_size=2, max_size=12),
    rounds=st.integers(1, 4),
)
def test_dp_adaptive_norm_follows_the_same_schedule_as_the_robust_one(
    norms: list[float], rounds: int
) -> None:
    """With the count's noise negligible, the DP rule's norm moves exactly as
    ``strategy.robust``'s adaptive clip (one shared QuantileClipNorm), when every update
    arrives and the denominator is the cohort."""
    from geofl.server.strategies.robust import AdaptiveClip, QuantileClipNorm

    rng = np.random.default_rng(5)
    dp = GaussianClip(
        1.0,
        1.0,
        len(norms),
        target_quantile=0.4,
        learning_rate=0.3,
        count_noise_multiplier=1e-12,
        rng=np.random.default_rng(6),
    )
    plain = AdaptiveClip(1.0, target_quantile=0.4, learning_rate=0.3)
    assert isinstance(dp.norm, QuantileClipNorm) and isinstance(plain.norm, QuantileClipNorm)
    for _ in range(rounds):
        updates = [_update(rng, norm) for norm in norms]
        for rule in (dp, plain):
            acc = rule.accumulator(SPEC)
            for update in updates:
                acc.add(update, 1.0)
            rule.commit(acc.mean())
        assert dp.clip_norm == pytest.approx(plain.clip_norm, rel=1e-9)
