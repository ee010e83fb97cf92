"""An open long poll is a node's heartbeat: idle nodes send no heartbeats, and stay online.

A large federation is mostly idle nodes waiting for work; each used to send a heartbeat
every interval besides its long poll, which made heartbeats most of a crowd's RPCs
(issue 14, load). Over real gRPC on loopback with a 0.2 s interval (a node is offline
after 3 silent intervals, 0.6 s).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from geofl.client.runtime import ClientRuntime

from .conftest import run_config, run_rows

INTERVAL_S = 0.2


def _count_heartbeats(runtime: ClientRuntime) -> list[float]:
    """Record when ``runtime`` sends a heartbeat (it still sends it)."""
    sent: list[float] = []
    conn = runtime._conn
    send = conn.heartbeat
    lock = threading.Lock()

    def counted(timeout: float) -> None:
        with lock:
            sent.append(time.monotonic())
        send(timeout)

    conn.heartbeat = counted  # type: ignore[method-assign]
    return sent


def test_a_polling_node_sends_no_heartbeats_and_stays_online(tmp_path: Path, serve: Any) -> None:
    config = run_config(
        tmp_path,
        run={"name": "poll-liveness", "rounds": 1, "seed": 1},
        strategy={"name": "fedavg", "clients_per_round": 2, "min_clients": 2},
        server={"address": "127.0.0.1:0", "heartbeat_interval_s": INTERVAL_S},
    )
    server = serve(config)
    idle = server.add_client(0, behaviour="slow", delay_s=1.0)
    idle_beats = _count_heartbeats(idle)
    deadline = time.monotonic() + 10
    while idle.session is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert idle.session is not None, "the first node did not join"

    time.sleep(8 * INTERVAL_S)  # waiting for a second node, in long polls only
    assert idle_beats == []
    online = [s.name for s in server.coordinator.registry.online()]
    assert online == ["node-0"], "a node in a long poll was taken for gone"

    # The round starts; each fit takes 1 s (5 intervals) outside any poll.
    other = server.add_client(1, behaviour="slow", delay_s=1.0)
    other_beats = _count_heartbeats(other)
    result = server.wait()
    _, rounds, participations = run_rows(config)
    assert result.status == "completed", [(p.status, p.reason) for p, _ in participations]
    assert [(r.number, r.status, r.num_succeeded) for r in rounds] == [(1, "committed", 2)]
    assert {p.status for p, _ in participations} == {"ok"}
    assert len(idle_beats) >= 2 and len(other_beats) >= 2, "no heartbeats while fitting"
