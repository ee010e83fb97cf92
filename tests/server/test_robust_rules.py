"""The robust rules as a round uses them: accumulators, spilled files, checks and state."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.strategies import FedAdam, FedAvg, StrategyError, UpdateRejected
from geofl.server.strategies.robust import (
    AdaptiveClip,
    CenteredClip,
    CoordinateMedian,
    FixedClip,
    Krum,
    MultiKrum,
    RobustStrategy,
    TrimmedMean,
    make_rule,
)
from geofl.server.strategies.robust import spill as spill_module
from geofl.storage import CheckpointStore

SETTINGS = settings(max_examples=25, deadline=None)

MODEL = {
    "w": np.zeros((6, 5), np.float32),
    "b": np.zeros(7, np.float64),
    "steps": np.zeros((), np.int64),
}
FLOATS = ("w", "b")


def random_updates(seed: int, n: int, scale: float = 1.0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [
        {
            "w": (scale * rng.normal(size=(6, 5))).astype(np.float32),
            "b": scale * rng.normal(size=7),
            "steps": np.array(int(rng.integers(0, 5)), np.int64),
        }
        for _ in range(n)
    ]


def stacked(updates: list[dict[str, np.ndarray]]) -> np.ndarray:
    return np.stack(
        [np.concatenate([u[k].astype(np.float64).reshape(-1) for k in MODEL]) for u in updates]
    )


def flat(weights: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(weights[k], np.float64).reshape(-1) for k in MODEL])


@contextlib.contextmanager
def tiny_blocks() -> Iterator[None]:
    """Blocks of about 4 coordinates: the rules cross tensor and block boundaries."""
    saved = spill_module.MIN_BLOCK, spill_module.BLOCK
    spill_module.MIN_BLOCK, spill_module.BLOCK = 4, 8
    try:
        yield
    finally:
        spill_module.MIN_BLOCK, spill_module.BLOCK = saved


@pytest.fixture
def small_blocks() -> Iterator[None]:
    with tiny_blocks():
        yield


def aggregate(rule: object, updates: list[dict[str, np.ndarray]]) -> tuple[dict, list]:
    accumulator = rule.accumulator(MODEL)  # type: ignore[attr-defined]
    checks = [accumulator.add(u, 10.0) for u in updates]
    try:
        return accumulator.mean(), checks
    finally:
        accumulator.close()


def as_model(vector: np.ndarray) -> np.ndarray:
    """What the rule's result is once cast back: float32 ``w``, rounded ``steps``."""
    out = vector.copy()
    out[:30] = out[:30].astype(np.float32)
    out[-1] = np.rint(out[-1])
    return out


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(1, 9))
def test_spilled_median_is_the_in_memory_median(seed: int, n: int) -> None:
    updates = random_updates(seed, n)
    with tiny_blocks():
        mean, _ = aggregate(CoordinateMedian(0), updates)
    np.testing.assert_allclose(flat(mean), as_model(np.median(stacked(updates), axis=0)), rtol=1e-6)


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.integers(3, 9), st.data())
def test_spilled_trimmed_mean_is_the_in_memory_one(seed: int, n: int, data: st.DataObject) -> None:
    trim = data.draw(st.integers(0, (n - 1) // 2))
    updates = random_updates(seed, n)
    with tiny_blocks():
        mean, checks = aggregate(TrimmedMean(trim), updates)
    expected = np.sort(stacked(updates), axis=0)[trim : n - trim].mean(axis=0)
    np.testing.assert_allclose(flat(mean), as_model(expected), rtol=1e-6, atol=1e-9)
    assert all(c.used for c in checks)


@pytest.mark.usefixtures("small_blocks")
def test_multi_krum_leaves_the_far_attackers_out() -> None:
    honest = random_updates(1, 5)
    attackers = random_updates(2, 2, scale=1e6)
    updates = [attackers[0], *honest[:3], attackers[1], *honest[3:]]
    mean, checks = aggregate(MultiKrum(2), updates)
    assert [c.used for c in checks] == [False, True, True, True, False, True, True]
    np.testing.assert_allclose(flat(mean), as_model(stacked(honest).mean(axis=0)), rtol=1e-5)
    assert checks[0].reason is not None and checks[0].reason.startswith("multi_krum: not selected")
    assert checks[0].scale == 0.0 and checks[1].reason is None


@pytest.mark.usefixtures("small_blocks")
def test_krum_picks_one_honest_update() -> None:
    honest = random_updates(3, 4)
    updates = [*honest, random_updates(4, 1, scale=1e6)[0]]
    mean, checks = aggregate(Krum(1), updates)
    assert sum(c.used for c in checks) == 1 and not checks[-1].used
    chosen = next(i for i, c in enumerate(checks) if c.used)
    np.testing.assert_allclose(flat(mean), as_model(stacked(honest)[chosen]), rtol=1e-6)


@pytest.mark.usefixtures("small_blocks")
def test_centered_clipping_is_its_definition_and_keeps_history() -> None:
    updates = [*random_updates(5, 4), random_updates(6, 1, scale=1e6)[0]]
    rule = CenteredClip(radius=2.0, iterations=3, byzantine=2)
    x = stacked(updates)
    center = np.zeros(x.shape[1])
    for _ in range(3):  # the reference: v <- v + mean(clip(x - v, tau)), dense
        offsets = x - center
        norms = np.linalg.norm(offsets, axis=1)
        center = center + (offsets * np.minimum(1, 2.0 / norms)[:, None]).mean(axis=0)
    mean, checks = aggregate(rule, updates)
    np.testing.assert_allclose(flat(mean), as_model(center), rtol=1e-5)
    assert checks[-1].reason is not None and "clipped to radius 2" in checks[-1].reason
    assert rule.state() == {}  # the centre is taken in only when the round is applied
    rule.commit(mean)
    np.testing.assert_allclose(rule.state()["center"], flat(mean))


def test_spilled_files_are_removed_on_close(tmp_path: Path) -> None:
    accumulator = CoordinateMedian(0, spill_dir=tmp_path).accumulator(MODEL)
    for update in random_updates(7, 3):
        accumulator.add(update, 1.0)
    directory = accumulator.directory
    assert directory.parent == tmp_path and len(list(directory.iterdir())) == 3
    accumulator.mean()
    accumulator.close()
    accumulator.close()
    assert not directory.exists() and list(tmp_path.iterdir()) == []


def test_a_rejected_update_is_not_spilled(tmp_path: Path) -> None:
    accumulator = TrimmedMean(0, spill_dir=tmp_path).accumulator(MODEL)
    bad = random_updates(8, 1)[0]
    bad["b"][3] = np.nan
    with pytest.raises(UpdateRejected, match="finite"):
        accumulator.add(bad, 1.0)
    assert accumulator.count == 0 and list(accumulator.directory.iterdir()) == []
    accumulator.close()


def test_too_few_updates_for_the_breakdown_point_fail_the_mean() -> None:
    accumulator = Krum(1).accumulator(MODEL)
    for update in random_updates(9, 4):
        accumulator.add(update, 1.0)
    with pytest.raises(StrategyError, match="needs at least 5 updates, the round has 4"):
        accumulator.mean()
    accumulator.close()


@SETTINGS
@given(st.integers(0, 2**32 - 1), st.floats(1e-3, 10.0), st.floats(1e-3, 1e7))
def test_a_clipped_update_never_exceeds_the_bound(seed: int, bound: float, scale: float) -> None:
    update = random_updates(seed, 1, scale=scale)[0]
    mean, (check,) = aggregate(FixedClip(bound), [update])
    norm = float(np.sqrt(sum(np.sum(np.asarray(mean[k], np.float64) ** 2) for k in FLOATS)))
    assert norm <= bound * (1 + 1e-5)
    assert mean["steps"] == update["steps"]  # integer counters are not clipped
    assert (check.reason is None) == (check.norm <= bound)


def test_clipping_weighs_updates_once_unless_told_otherwise() -> None:
    small = {k: np.ones_like(v) for k, v in MODEL.items()}
    large = {k: 3 * np.ones_like(v) for k, v in MODEL.items()}
    for weighted, expected in ((False, 2.0), (True, 2.5)):
        accumulator = FixedClip(1e9, weighted=weighted).accumulator(MODEL)
        accumulator.add(small, 1.0)
        accumulator.add(large, 3.0)
        assert float(accumulator.mean()["b"][0]) == pytest.approx(expected)


def test_adaptive_clip_steps_after_the_round_is_applied() -> None:
    rule = AdaptiveClip(initial_clip_norm=1.0, target_quantile=0.5, learning_rate=0.2)
    strategy = RobustStrategy(FedAvg(), rule)
    accumulator = strategy.begin_round(MODEL)
    for update in random_updates(10, 4, scale=100.0):  # all far over the norm: b = 0
        assert accumulator.add(update, 1.0).reason is not None
    mean = accumulator.mean()
    assert rule.clip_norm == 1.0
    strategy.apply(MODEL, mean, 1)
    assert rule.clip_norm == pytest.approx(np.exp(0.2 * 0.5))
    saved = strategy.state()
    other = RobustStrategy(FedAvg(), AdaptiveClip(initial_clip_norm=1.0))
    other.load_state(saved)
    assert other.rule.clip_norm == rule.clip_norm  # type: ignore[attr-defined]


def test_robust_strategy_composes_with_fedadam() -> None:
    updates = random_updates(11, 5)
    robust = RobustStrategy(FedAdam(server_lr=0.1), CoordinateMedian(1))
    accumulator = robust.begin_round(MODEL)
    for update in updates:
        accumulator.add(update, 1.0)
    median = accumulator.mean()
    accumulator.close()
    plain = FedAdam(server_lr=0.1)
    expected = plain.apply(MODEL, median, 1)
    got = robust.apply(MODEL, median, 1)
    for name in MODEL:
        np.testing.assert_array_equal(got[name], expected[name])
    assert set(robust.state()) == set(plain.state())
    with pytest.raises(StrategyError, match="keeps no state"):
        robust.load_state({**plain.state(), "robust:center": np.zeros(3)})


def test_rules_refuse_bad_settings_by_name() -> None:
    with pytest.raises(ValueError, match="robust rule 'clip': clip_norm must be in"):
        make_rule("clip", clip_norm=0.0)
    with pytest.raises(ValueError, match="byzantine must be an integer >= 0"):
        make_rule("median", byzantine=-1)
    with pytest.raises(ValueError, match="unknown robust rule 'mean'"):
        make_rule("mean")
    with pytest.raises(ValueError, match="unexpected keyword"):
        make_rule("krum", byzantine=1, select=2)


def test_a_full_disk_rejects_that_update_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    accumulator = CoordinateMedian(0, spill_dir=tmp_path).accumulator(MODEL)
    good, lost = random_updates(12, 2)
    accumulator.add(good, 1.0)

    def no_space(layout: object, update: object, target: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spill_module.ModelLayout, "write", no_space)
    with pytest.raises(UpdateRejected, match="could not spill the update to disk"):
        accumulator.add(lost, 1.0)
    monkeypatch.undo()
    assert len(list(accumulator.directory.iterdir())) == 1
    np.testing.assert_allclose(flat(accumulator.mean()), as_model(stacked([good])[0]), rtol=1e-6)
    accumulator.close()


def test_rule_state_survives_a_checkpoint(tmp_path: Path) -> None:
    """The centre is saved beside the model and restored on resume."""
    strategy = RobustStrategy(FedAdam(), CenteredClip(radius=1.0))
    accumulator = strategy.begin_round(MODEL)
    for update in random_updates(13, 3):
        accumulator.add(update, 1.0)
    mean = accumulator.mean()
    accumulator.close()
    new_weights = strategy.apply(MODEL, mean, 1)
    store = CheckpointStore(tmp_path)
    record = store.save(1, 1, new_weights, strategy.state())
    _, state = store.load(record)
    resumed = RobustStrategy(FedAdam(), CenteredClip(radius=1.0))
    resumed.load_state(state)
    for key, value in strategy.state().items():
        np.testing.assert_array_equal(resumed.state()[key], value)
    assert "robust:center" in state
