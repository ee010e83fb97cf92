"""Liveness: uploads and polls are proof of life, a saturated server expires no one, and a
node taken offline for silence is back at its next call."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator

import pytest

from geofl.protocols.errors import SessionError
from geofl.protocols.v1 import geofl_pb2 as pb
from geofl.server.coordinator import reap_offline
from geofl.server.nodes.clock import LoopLoad
from geofl.server.nodes.identity import NodeIdentity
from geofl.server.nodes.registry import Registry
from geofl.server.transport.servicer import CoordinatorServicer, ServerState


class SteppingClock:
    """A clock the test moves by hand."""

    simulated = True

    def __init__(self) -> None:
        self.now_s = 1000.0

    def time(self) -> float:
        return self.now_s

    def monotonic(self) -> float:
        return self.now_s

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self.now_s, dt.UTC)


def test_every_upload_chunk_refreshes_the_session() -> None:
    clock = SteppingClock()

    async def main() -> list[float]:
        registry = Registry(heartbeat_interval_s=5.0, patience=3, clock=clock)
        token = registry.add(7, "slow", "far", {})
        session = registry.session(token)
        state = ServerState(registry, 1, "run", (), lambda name, region, config: 7)
        servicer = CoordinatorServicer(state)
        seen: list[float] = []

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(4):
                clock.now_s += 10.0  # each chunk takes 10 s on the wire: 40 s in all
                yield b"x"

        async for _ in servicer._alive_while(session, chunks()):
            seen.append(session.last_seen)
            assert registry.expire() == []  # 10 s < 3 x 5 s patience since the last chunk
        clock.now_s += 16.0  # silence beyond the patience: now it is gone
        assert [s.node_id for s in registry.expire()] == [7]
        return seen

    assert asyncio.run(main()) == [1010.0, 1020.0, 1030.0, 1040.0]


def test_an_open_poll_keeps_a_node_online_until_grpc_cancels_it() -> None:
    clock = SteppingClock()

    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0, patience=3, clock=clock)
        session = registry.session(registry.add(7, "idle", None, {}))
        servicer = CoordinatorServicer(ServerState(registry, 1, "run", (), lambda *_: 7))
        poll = asyncio.ensure_future(servicer._next_task(session, timeout=600.0))
        await asyncio.sleep(0)
        assert session.polls_open == 1
        clock.now_s += 100.0  # no heartbeat for 20 intervals, but the poll is open
        assert registry.expire() == []
        poll.cancel()  # the node went away: gRPC cancels its call
        with contextlib.suppress(asyncio.CancelledError):
            await poll
        assert session.polls_open == 0
        assert [s.node_id for s in registry.expire()] == [7]  # silent for 100 s

    asyncio.run(main())


def test_a_poll_that_times_out_counts_as_contact() -> None:
    clock = SteppingClock()

    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0, patience=3, clock=clock)
        session = registry.session(registry.add(7, "idle", None, {}))
        servicer = CoordinatorServicer(ServerState(registry, 1, "run", (), lambda *_: 7))
        poll = asyncio.ensure_future(servicer._next_task(session, timeout=0.05))
        await asyncio.sleep(0)
        clock.now_s += 30.0  # the poll's 30 s on the node's clock
        task = await poll
        assert task.kind == pb.TASK_KIND_WAIT and session.polls_open == 0
        clock.now_s += 14.0  # within 3 intervals of the poll's end
        assert registry.expire() == []
        clock.now_s += 2.0
        assert [s.node_id for s in registry.expire()] == [7]

    asyncio.run(main())


class _Ticks:
    """The loop thread's and the process's CPU clocks and a wall clock, moved by hand."""

    def __init__(self) -> None:
        self.thread = self.process = self.wall = 0.0

    def load(self, cpus: int = 2) -> LoopLoad:
        return LoopLoad(lambda: self.thread, lambda: self.process, lambda: self.wall, cpus)


def test_loop_load_is_the_busier_of_the_loop_thread_and_the_process() -> None:
    ticks = _Ticks()
    load = ticks.load(cpus=2)
    ticks.thread, ticks.process, ticks.wall = 4.8, 5.0, 5.0  # the loop thread saturated
    assert load.share() == pytest.approx(0.96)
    ticks.thread, ticks.process, ticks.wall = 5.3, 14.5, 10.0  # both CPUs taken by threads
    assert load.share() == pytest.approx(0.95)
    ticks.thread, ticks.process, ticks.wall = 5.8, 15.5, 15.0
    assert load.share() == pytest.approx(0.1)
    assert load.share() == 0.0  # no time passed


def test_reaper_expires_nobody_after_a_saturated_interval() -> None:
    """A join storm: the loop was busy for the whole interval, so silence says nothing."""

    async def main() -> list[str]:
        registry = Registry(heartbeat_interval_s=0.05, patience=1)
        registry.add(7, "queued", None, {})
        ticks = _Ticks()
        reaper = asyncio.create_task(reap_offline(registry, ticks.load()))
        for _ in range(4):  # four saturated intervals: the node's poll may wait in a queue
            ticks.thread += 1.0
            ticks.process += 1.0
            ticks.wall += 1.0
            await asyncio.sleep(0.06)
        kept = [s.name for s in registry.online()]
        ticks.wall += 1.0  # an idle interval: now silence counts
        await asyncio.sleep(0.15)
        reaper.cancel()
        assert [s.name for s in registry.online()] == []
        return kept

    assert asyncio.run(main()) == ["queued"]


def test_a_node_taken_offline_for_silence_is_back_at_its_next_call() -> None:
    """Its call may only have waited in a queue: no new join, but its task stays dropped."""
    clock = SteppingClock()

    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0, clock=clock)
        token = registry.add(7, "late", None, {}, peer="ipv4:127.0.0.1:5000")
        task = registry.assign(
            registry.session(token, "ipv4:127.0.0.1:5000"), "fit", 1, 0, {}, 1e12
        )
        changes: list[int] = []
        registry.changes.subscribe(lambda: changes.append(1))
        clock.now_s += 16.0
        assert [s.node_id for s in registry.expire()] == [7]
        assert registry.online() == [] and task.future.result().status == "dropped"
        with pytest.raises(SessionError, match="bound to another connection"):
            registry.session(token, "ipv4:127.0.0.1:6000")
        assert registry.online() == []
        session = registry.session(token, "ipv4:127.0.0.1:5000")
        assert session.online and registry.available() == [session]
        assert session.current is None and len(changes) == 2  # offline, then back
        assert registry.expire() == []  # the call was contact

    asyncio.run(main())


def test_a_revoked_node_taken_offline_for_silence_cannot_come_back() -> None:
    clock = SteppingClock()

    async def main() -> None:
        registry = Registry(heartbeat_interval_s=5.0, clock=clock)
        identity = NodeIdentity("gone", None, "key SHA256:x")
        token = registry.add(7, "gone", None, {}, identity=identity)
        clock.now_s += 16.0
        assert len(registry.expire()) == 1
        assert [s.node_id for s in registry.end_sessions(lambda _: False, "revoked")] == [7]
        with pytest.raises(SessionError, match="unknown node session"):
            registry.session(token)

    asyncio.run(main())
