"""The virtual-time event loop: idle time is skipped, real work freezes the clock."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from geofl.server.nodes.clock import WALL_CLOCK, LoopClock
from geofl.server.simulation.virtual_loop import VirtualTimeLoop, real_work, run_virtual


def test_sleep_moves_the_clock_by_exactly_the_sleep() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.sleep(3600)
        middle = loop.time()
        await asyncio.sleep(0.25)
        return middle - start, loop.time() - middle

    # The loop's clock starts at the host's monotonic time, so a difference of two
    # readings is exact only up to the rounding of that base (~1e-12 s here).
    assert run_virtual(main()) == pytest.approx((3600.0, 0.25), abs=1e-9)


def test_timers_fire_in_order_of_simulated_time() -> None:
    async def main() -> list[int]:
        order: list[int] = []

        async def after(delay: float, tag: int) -> None:
            await asyncio.sleep(delay)
            order.append(tag)

        await asyncio.gather(*(after(d, t) for t, d in enumerate([5.0, 0.5, 2.0, 0.0])))
        return order

    assert run_virtual(main()) == [3, 1, 2, 0]


def test_executor_work_does_not_advance_the_clock() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await asyncio.to_thread(time.sleep, 0.05)  # real time passes, simulated does not
        return loop.time() - start

    assert run_virtual(main()) == 0.0


def test_held_future_keeps_timers_waiting() -> None:
    """A timer due at +1 s must not fire while a real computation it waits behind runs."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        events: list[str] = []
        future: asyncio.Future[str] = loop.create_future()

        def compute() -> None:
            time.sleep(0.05)
            loop.call_soon_threadsafe(future.set_result, "done")

        async def timer() -> None:
            await asyncio.sleep(1.0)
            events.append(f"timer at {loop.time() - start:g}")

        start = loop.time()
        waiting = asyncio.ensure_future(timer())
        threading.Thread(target=compute).start()
        events.append(await real_work(future))
        await waiting
        return events

    assert run_virtual(main()) == ["done", "timer at 1"]


def test_wait_for_times_out_in_simulated_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), timeout=7)
        return loop.time() - start

    assert run_virtual(main()) == pytest.approx(7.0, abs=1e-9)  # see the first test


def test_loop_clock_is_marked_simulated_only_on_the_virtual_loop() -> None:
    async def probe() -> tuple[bool, float, float]:
        clock = LoopClock(asyncio.get_running_loop(), epoch=1_000_000.0)
        await asyncio.sleep(30)
        return clock.simulated, clock.time(), clock.elapsed()

    assert run_virtual(probe()) == (True, 1_000_030.0, 30.0)
    simulated, _, _ = asyncio.run(_plain_probe())
    assert simulated is False
    assert WALL_CLOCK.simulated is False


async def _plain_probe() -> tuple[bool, float, float]:
    clock = LoopClock(asyncio.get_running_loop())
    return clock.simulated, clock.time(), clock.elapsed()


def test_real_work_is_a_plain_await_on_an_ordinary_loop() -> None:
    async def main() -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        future.set_result(4)
        return await real_work(future)

    assert asyncio.run(main()) == 4


def test_loop_is_closed_after_run_virtual() -> None:
    loops: list[asyncio.AbstractEventLoop] = []

    async def main() -> None:
        loops.append(asyncio.get_running_loop())

    run_virtual(main())
    assert isinstance(loops[0], VirtualTimeLoop) and loops[0].is_closed()
