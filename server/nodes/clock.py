"""The server's sense of time, injected so a simulation can run it on a virtual clock.

The round engine, the registry and the recorder never call :func:`time.time` directly:
they ask a :class:`Clock`. In a deployment that is :data:`WALL_CLOCK`. Under
``simulation.clock: virtual`` it is a :class:`LoopClock` over
:class:`geofl.server.simulation.virtual_loop.VirtualTimeLoop`, whose time jumps to the
next timer whenever nothing real is running, so deadlines, stragglers and round
durations happen in simulated seconds while the code that runs is the real one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["WALL_CLOCK", "Clock", "LoopClock", "LoopLoad", "WallClock"]


class Clock(Protocol):
    """Where the server reads the time."""

    #: True when the times are simulated (recorded as such in the database).
    simulated: bool

    def time(self) -> float:
        """Seconds since the Unix epoch (deadlines, timestamps)."""
        ...

    def monotonic(self) -> float:
        """A monotonic reading, for durations and waits."""
        ...

    def now(self) -> dt.datetime:
        """:meth:`time` as an aware UTC datetime (database timestamps)."""
        ...


class WallClock:
    """Real time."""

    simulated = False

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


#: The clock of every deployment.
WALL_CLOCK: Clock = WallClock()


class LoopClock:
    """The time of an event loop, as Unix time from ``epoch`` (default: now, really).

    Asyncio's own timeouts (``wait_for``, ``sleep``) read the loop's time, so reading the
    same clock here keeps the engine's deadlines and the loop's timers in one time base.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, epoch: float | None = None) -> None:
        self._loop = loop
        self._origin = loop.time()
        self._epoch = time.time() if epoch is None else epoch
        self.simulated = bool(getattr(loop, "virtual", False))

    def time(self) -> float:
        return self._epoch + (self._loop.time() - self._origin)

    def monotonic(self) -> float:
        return self._loop.time()

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.time(), dt.UTC)

    def elapsed(self) -> float:
        """Seconds since this clock was made."""
        return self._loop.time() - self._origin


class LoopLoad:
    """How saturated the server was since the last look, as a share of what it could use.

    The larger of two shares of wall time: the event loop thread's CPU time
    (``time.thread_time``, so it is made and read on the loop's thread), and the process's
    CPU time over the CPUs it may run on. Either near 1.0 means calls that arrived may
    still wait, not taken up: the loop is busy, or the process has no CPU left.
    """

    def __init__(
        self,
        thread_cpu: Callable[[], float] = time.thread_time,
        process_cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
    ) -> None:
        self._clocks = (thread_cpu, process_cpu, wall)
        self._cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
        self._last = self._read()

    def _read(self) -> tuple[float, float, float]:
        thread_cpu, process_cpu, wall = self._clocks
        return thread_cpu(), process_cpu(), wall()

    def share(self) -> float:
        """The larger share since the previous call (or since made)."""
        now = self._read()
        thread, process, elapsed = (a - b for a, b in zip(now, self._last, strict=True))
        self._last = now
        return max(thread, process / self._cpus) / elapsed if elapsed > 0 else 0.0
