"""Database work of a served run, done in order on one thread so the event loop never waits.

:class:`geofl.storage.Database` rides out an outage by retrying (``storage.retry_s``):
the calling thread sleeps until the database is back. Called on the coordinator's event
loop, that sleep stopped every RPC for as long as the outage lasted: heartbeats went
unanswered and a client's long poll ran past its gRPC deadline, so the client re-joined
(and, before :meth:`Registry.add` carried open tasks over, lost its task, failing the
round). Observers that write to the database hand that work to a :class:`SerialWriter`
instead: one worker thread runs it in the order it was handed over (a round's rows are
written before its commit), and only :meth:`SerialWriter.call` (the commit) is awaited,
while the loop goes on answering RPCs. A failure of queued work (the database stayed away
past ``retry_s``) is raised by the next call, so it ends the run as before.

Simulations on the virtual clock use :class:`InlineWriter`: the work runs at once, on
the caller's thread, as it always did (a simulated run has no RPCs to keep answering).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

__all__ = ["InlineWriter", "SerialWriter", "Writer"]


class Writer:
    """Where database work runs: at once (this class), or on a worker thread."""

    def submit(self, work: Callable[[], object]) -> None:
        """Run ``work``; raise the failure of earlier work first."""
        work()

    async def call(self, work: Callable[[], T]) -> T:
        """Run ``work`` after everything submitted before it; its result."""
        return work()

    async def drain(self) -> None:
        """Return once everything submitted so far has run (raising its failure)."""

    def close(self) -> None:
        """Stop accepting work; wait for what is queued."""


InlineWriter = Writer


class SerialWriter(Writer):
    """Runs database work in submission order on one worker thread (see the module)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="geofl-db")
        self._failure: BaseException | None = None
        self._lock = threading.Lock()

    def _check(self) -> None:
        with self._lock:
            failure = self._failure
        if failure is not None:
            raise failure

    def _note(self, done: Future[object]) -> None:
        error = done.exception()
        if error is not None:
            with self._lock:
                self._failure = self._failure or error

    def submit(self, work: Callable[[], object]) -> None:
        self._check()
        self._pool.submit(work).add_done_callback(self._note)

    async def call(self, work: Callable[[], T]) -> T:
        self._check()
        result = await asyncio.wrap_future(self._pool.submit(work))
        self._check()  # queued work that failed before this one ran
        return result

    async def drain(self) -> None:
        await self.call(lambda: None)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
