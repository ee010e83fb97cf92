"""A node's upload is proof of life: heartbeats queued behind it on a slow link don't count."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

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
