"""Running a command's event loop so that Ctrl-C and SIGTERM end it cleanly."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["run_until_signal"]

T = TypeVar("T")


def run_until_signal(
    work: Callable[[], Awaitable[T]],
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> T:
    """Run ``work()`` on a new event loop; SIGINT and SIGTERM cancel it (KeyboardInterrupt).

    Cancelling the main task lets every ``finally`` run: client processes are stopped and
    the gRPC server shuts down on its own loop, instead of being torn down by the
    interpreter later. ``loop_factory`` makes the loop (e.g. a virtual-time one); default:
    asyncio's.
    """

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - asyncio.run always runs main() as a task
            raise RuntimeError("no current task")
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        return await work()

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
