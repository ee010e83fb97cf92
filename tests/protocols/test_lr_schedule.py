"""Warmup then cosine decay: its fixed points, and its shape for any settings."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from geofl.protocols.lr_schedule import check_schedule, scheduled_lr


def test_fixed_points() -> None:
    lr = 2e-3
    assert scheduled_lr(lr, 1, 4, 0, 0.1) == pytest.approx(lr / 4)
    assert scheduled_lr(lr, 4, 4, 104, 0.1) == pytest.approx(lr)
    assert scheduled_lr(lr, 54, 4, 104, 0.1) == pytest.approx(lr * 0.55)  # half way: the mean
    assert scheduled_lr(lr, 104, 4, 104, 0.1) == pytest.approx(lr * 0.1)
    assert scheduled_lr(lr, 500, 4, 104, 0.1) == pytest.approx(lr * 0.1)
    assert scheduled_lr(lr, 500, 0, 0, 0.1) == lr  # no schedule: constant


@given(
    warmup=st.integers(0, 50),
    span=st.integers(1, 500),
    ratio=st.floats(0.0, 1.0),
    lr=st.floats(1e-6, 10.0),
)
def test_rises_through_warmup_then_never_rises(
    warmup: int, span: int, ratio: float, lr: float
) -> None:
    decay = warmup + span
    check_schedule(warmup, decay, ratio)
    rates = [scheduled_lr(lr, step, warmup, decay, ratio) for step in range(1, decay + 3)]
    assert all(0.0 < r <= lr * (1 + 1e-12) for r in rates[:warmup])
    assert all(b >= a for a, b in itertools.pairwise(rates[:warmup]))
    after = rates[warmup:]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(after))
    assert math.isclose(after[-1], lr * ratio, rel_tol=1e-9, abs_tol=1e-15)
    assert all(lr * ratio * (1 - 1e-12) <= r <= lr * (1 + 1e-12) for r in after)


@pytest.mark.parametrize(
    ("warmup", "decay", "ratio", "message"),
    [
        (-1, 0, 0.1, "must be >= 0"),
        (10, 10, 0.1, "must exceed warmup"),
        (0, 10, 1.5, "final_ratio"),
    ],
)
def test_settings_that_make_no_schedule_are_named(
    warmup: int, decay: int, ratio: float, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        check_schedule(warmup, decay, ratio)


def test_steps_count_from_one() -> None:
    with pytest.raises(ValueError, match="count from 1"):
        scheduled_lr(1.0, 0, 0, 0, 0.1)
