"""Riding out a database outage: re-joins keep their task; database work leaves the loop free.

A client whose long poll timed out while the coordinator waited on the database re-joins;
that used to drop its open task (``node re-joined``), failing the round. And the
coordinator's event loop itself waited on the database, so no RPC was answered.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from geofl.protocols.errors import SessionError
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.writer import SerialWriter


def _assign(registry: Registry, token: str) -> TaskRecord:
    session = registry.session(token)
    return registry.assign(session, "fit", 1, 0, {}, time.time() + 60)


def test_rejoined_node_is_sent_its_open_task_again() -> None:
    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0)
        first = registry.add(3, "site-3", None, {})
        task = _assign(registry, first)
        registry.session(first).mailbox.get_nowait()  # delivered; the reply was lost
        second = registry.add(3, "site-3", None, {})
        session = registry.session(second)
        assert session.current is task and not task.future.done()
        assert session.mailbox.get_nowait() is task  # sent again on its next GetTask
        with pytest.raises(SessionError, match="unknown node session"):
            registry.session(first)

    asyncio.run(main())


def test_rejoined_node_keeps_a_task_it_is_uploading_without_resending_it() -> None:
    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0)
        first = registry.add(3, "site-3", None, {})
        task = _assign(registry, first)
        registry.session(first).mailbox.get_nowait()
        registry.start_upload(task, 1)
        session = registry.session(registry.add(3, "site-3", None, {}))
        assert session.current is task and session.mailbox.empty()
        task.settle(Outcome("ok"))
        await asyncio.sleep(0)
        assert session.current is None and registry.available() == [session]

    asyncio.run(main())


def test_rejoin_after_the_task_settled_carries_nothing() -> None:
    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0)
        first = registry.add(3, "site-3", None, {})
        task = _assign(registry, first)
        task.settle(Outcome("late", "deadline"))
        session = registry.session(registry.add(3, "site-3", None, {}))
        assert session.current is None and session.mailbox.empty()

    asyncio.run(main())


def test_serial_writer_runs_in_order_while_the_loop_keeps_going() -> None:
    release = threading.Event()
    done: list[int] = []

    def blocked() -> None:  # a database that is away until released
        assert release.wait(10)
        done.append(1)

    async def main() -> list[str]:
        writer = SerialWriter()
        events: list[str] = []
        writer.submit(blocked)
        writer.submit(lambda: done.append(2))
        commit = asyncio.ensure_future(writer.call(lambda: done.append(3) or len(done)))
        for _ in range(3):  # the loop answers other work meanwhile
            await asyncio.sleep(0.01)
            events.append("served")
        assert not commit.done() and done == []
        release.set()
        assert await commit == 3
        writer.close()
        return events

    assert asyncio.run(main()) == ["served"] * 3
    assert done == [1, 2, 3]


def test_serial_writer_raises_a_failure_of_queued_work_at_the_next_call() -> None:
    def fails() -> None:
        raise RuntimeError("database unavailable for 120 s")

    async def main() -> None:
        writer = SerialWriter()
        writer.submit(fails)
        with pytest.raises(RuntimeError, match="unavailable"):
            await writer.drain()
        with pytest.raises(RuntimeError, match="unavailable"):
            writer.submit(lambda: None)
        writer.close()

    asyncio.run(main())
