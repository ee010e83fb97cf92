"""Pure reductions from raw measurements (event logs, byte samples) to per-round numbers.

Kept free of processes and I/O so the arithmetic that the published ratios rest on is
unit-tested on its own.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from benchmarks.core import BenchmarkError, RoundRecord

__all__ = [
    "ByteSample",
    "bytes_between",
    "median_or_none",
    "proxy_bytes_per_round",
    "rounds_from_events",
]


@dataclass(frozen=True)
class ByteSample:
    """Cumulative proxy counters at wall time ``t`` (Unix seconds)."""

    t: float
    up: int
    down: int


def _optional_int(event: Mapping[str, object], key: str) -> int | None:
    value = event.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rounds_from_events(events: Sequence[Mapping[str, object]], rounds: int) -> list[RoundRecord]:
    """Turn ServerApp timing events into round records.

    A round runs from its ``round_start`` event to the next round's ``round_start``, the
    last one to the ``end`` event (after the final aggregation). Missing events mean the
    run did not complete, which is an error, not a shorter run. The system's own byte
    counts, when logged, come from ``round_start`` (``bytes_down``: what the round sent)
    and ``round_replies`` (``bytes_up``: what it aggregated).
    """
    starts: dict[int, float] = {}
    down: dict[int, int | None] = {}
    up: dict[int, int | None] = {}
    end: float | None = None
    for ev in events:
        kind, t = ev.get("event"), ev.get("t")
        if not isinstance(t, float | int):
            raise BenchmarkError(f"timing event without a numeric 't': {dict(ev)!r}")
        if kind in ("round_start", "round_replies"):
            number = ev.get("round")
            if not isinstance(number, int):
                raise BenchmarkError(f"{kind} event without an int 'round': {dict(ev)!r}")
            if kind == "round_start":
                starts[number], down[number] = float(t), _optional_int(ev, "bytes_down")
            else:
                up[number] = _optional_int(ev, "bytes_up")
        elif kind == "end":
            end = float(t)
    missing = [r for r in range(1, rounds + 1) if r not in starts]
    if missing or end is None:
        raise BenchmarkError(f"incomplete timing log: rounds {missing} missing, end={end}")
    bounds = [starts[r] for r in range(1, rounds + 1)] + [end]
    return [
        RoundRecord(
            number=r,
            duration_s=bounds[r] - bounds[r - 1],
            start_wall=bounds[r - 1],
            bytes_up=up.get(r),
            bytes_down=down.get(r),
        )
        for r in range(1, rounds + 1)
    ]


def bytes_between(samples: Sequence[ByteSample], t0: float, t1: float) -> tuple[int, int]:
    """Bytes (up, down) counted between wall times ``t0`` and ``t1``.

    Counters are a step function known at the sample times; each bound takes the last
    sample at or before it (before the first sample, nothing had been counted).
    """
    if t1 < t0:
        raise ValueError(f"interval ends before it starts: {t0} > {t1}")
    times = [s.t for s in samples]

    def at(t: float) -> tuple[int, int]:
        i = bisect.bisect_right(times, t) - 1
        return (0, 0) if i < 0 else (samples[i].up, samples[i].down)

    (u0, d0), (u1, d1) = at(t0), at(t1)
    return u1 - u0, d1 - d0


def proxy_bytes_per_round(
    samples: Sequence[ByteSample], rounds: Sequence[RoundRecord]
) -> list[tuple[int, int]] | None:
    """Proxy bytes (up, down) of each round, or None if a round lacks a start time."""
    out: list[tuple[int, int]] = []
    for rec in rounds:
        if rec.start_wall is None:
            return None
        out.append(bytes_between(samples, rec.start_wall, rec.start_wall + rec.duration_s))
    return out


def median_or_none(values: Sequence[float]) -> float | None:
    """The median, or None for no values (a system that could not report them)."""
    return statistics.median(values) if values else None
