"""An asyncio event loop whose clock jumps over idle time.

The loop's time is a number it keeps itself. Whenever the loop would block waiting for
its next timer and *nothing real is in progress*, it advances that number to the timer's
due time instead of sleeping, so ``asyncio.sleep(90)`` returns at once with the clock
90 s later. "Real" work is anything that takes CPU time outside the loop: executor
jobs (``asyncio.to_thread``, ``run_in_executor``, counted automatically) and futures
registered with :meth:`VirtualTimeLoop.hold` (e.g. a training job in a worker process
whose result some simulated client is waiting for). While any such work is pending the
loop blocks for real, so simulated time never runs ahead of a computation whose result
decides what happens next.

The consequence that matters for honesty: the time a computation takes on this machine
never shows up in simulated time. Durations come only from what the simulation sleeps
(link and compute models), plus zero for everything the server does. Where server-side
work should cost simulated time it must be modelled explicitly.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

__all__ = ["VirtualTimeLoop", "run_virtual"]

T = TypeVar("T")


class _JumpingSelector(selectors.DefaultSelector):
    """Polls instead of sleeping, and moves the loop's clock forward by the sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        if loop is None or loop.pending_real_work or timeout is None or timeout <= 0:
            events: list[tuple[selectors.SelectorKey, int]] = super().select(timeout)
            return events
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if not ready:
            loop.advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop on simulated time; see the module docstring."""

    #: Read by :class:`geofl.server.nodes.clock.LoopClock` to mark its times as simulated.
    virtual = True

    def __init__(self, start: float | None = None) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = time.monotonic() if start is None else start
        self._holds = 0
        #: Simulated seconds skipped so far (total time the loop did not sleep).
        self.skipped_s = 0.0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward (the selector calls this instead of sleeping)."""
        self._now += seconds
        self.skipped_s += seconds

    @property
    def pending_real_work(self) -> int:
        """Computations in progress that simulated time must wait for."""
        return self._holds

    def hold(self, future: asyncio.Future[Any]) -> None:
        """Freeze simulated time until ``future`` is done."""
        if future.done():
            return
        self._holds += 1
        future.add_done_callback(self._release)

    def _release(self, _: object) -> None:
        self._holds -= 1

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self.hold(future)
        return future


async def _hold(loop: VirtualTimeLoop, awaitable: Awaitable[T]) -> T:
    future = asyncio.ensure_future(awaitable)
    loop.hold(future)
    return await future


def run_virtual(main: Coroutine[Any, Any, T], *, start: float | None = None) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualTimeLoop`, then close it."""
    loop = VirtualTimeLoop(start)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


async def real_work(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` with simulated time frozen until it is done.

    On an ordinary loop this is a plain ``await``.
    """
    loop = asyncio.get_running_loop()
    if isinstance(loop, VirtualTimeLoop):
        return await _hold(loop, awaitable)
    return await awaitable


__all__ += ["real_work"]
