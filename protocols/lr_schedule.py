"""Warmup then cosine decay of a learning rate: one formula for the server and the sites.

Synchronous data parallel steps AdamW at the coordinator (``server.strategies.adamw``, step
``t`` = the round); DiLoCo's sites step their own AdamW (``examples.geo_lm``, step ``t`` =
the site's step count, kept across rounds). Both read the learning rate of step ``t`` from
:func:`scheduled_lr`, so the two compare at the same rate for the same step.

For a 1-based step ``t``, ``warmup`` steps ``W`` and ``decay`` steps ``D``::

    t <= W:       lr * t / W                         (linear warmup; none when W = 0)
    W < t <= D:   lr * (r + (1 - r) * (1 + cos(pi * (t - W) / (D - W))) / 2)
    t > D:        lr * r                             (r = final_ratio)

``D = 0`` means no decay (the rate stays ``lr`` after warmup).
"""

from __future__ import annotations

import math

__all__ = ["check_schedule", "scheduled_lr"]


def check_schedule(warmup: int, decay: int, final_ratio: float) -> None:
    """Raise ``ValueError`` naming the setting that makes no schedule."""
    if warmup < 0 or decay < 0:
        raise ValueError(f"warmup ({warmup}) and decay ({decay}) steps must be >= 0")
    if decay and decay <= warmup:
        raise ValueError(f"decay steps ({decay}) must exceed warmup steps ({warmup}), or be 0")
    if not 0.0 <= final_ratio <= 1.0:
        raise ValueError(f"final_ratio must be in [0, 1], got {final_ratio}")


def scheduled_lr(lr: float, step: int, warmup: int, decay: int, final_ratio: float) -> float:
    """The learning rate of 1-based ``step`` (module docstring)."""
    if step < 1:
        raise ValueError(f"steps count from 1, got {step}")
    if step <= warmup:
        return lr * step / warmup
    if decay == 0:
        return lr
    progress = min(1.0, (step - warmup) / (decay - warmup))
    return lr * (final_ratio + (1.0 - final_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
