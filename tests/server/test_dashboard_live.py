"""The dashboard's live state: what each round event changes, and that deltas carry only that.

The browser tests (tests/integration/test_dashboard.py) drive the whole page over a real
run; these pin the state's contract: a delta names only what changed since the last one,
a snapshot has everything, and both are plain JSON.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from geofl.server.dashboard.history import CLIENT_FIELDS, History
from geofl.server.dashboard.live import LiveState
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.records import Phase, RoundRecord, secagg_abort_reason
from geofl.server.scheduling.measurements import LinkEstimate


def task(node_id: int, round_number: int = 1, *, kind: str = "fit", down: int = 0) -> TaskRecord:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
    finally:
        loop.close()
    return TaskRecord(1, node_id, kind, round_number, 0, {}, 0.0, future, bytes_down=down)  # type: ignore[arg-type]


def clients(message: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A message's clients by id, each as a mapping (they travel as lists)."""
    return {
        key: dict(zip(CLIENT_FIELDS, row, strict=True)) for key, row in message["clients"].items()
    }


@pytest.fixture
def nodes() -> Registry:
    registry = Registry(heartbeat_interval_s=1.0)
    for node_id in range(1, 1001):
        registry.add(node_id, f"n{node_id}", "eu" if node_id % 2 else "us", {})
    registry.add(2000, "relay-ap", "ap", {"relay": True})
    return registry


@pytest.fixture
def live(nodes: Registry) -> LiveState:
    earlier = {"number": 1, "status": "committed", "duration_s": 2.0, "bytes_up": 5}
    history = History(
        run={"id": 3, "name": "demo", "status": "running", "last_committed_round": 1},
        runs=[{"id": 3, "name": "demo", "status": "running"}],
        rounds=[earlier],
        regions={"eu": {"bytes_up": 5, "bytes_down": 7}},
    )
    return LiveState(history, nodes)


def test_a_snapshot_has_the_history_and_every_online_node(live: LiveState) -> None:
    snapshot = json.loads(json.dumps(live.snapshot()))  # plain JSON, as sent
    assert snapshot["run"]["name"] == "demo" and snapshot["rounds"][0]["number"] == 1
    assert snapshot["client_fields"] == list(CLIENT_FIELDS)
    listed = clients(snapshot)
    assert len(listed) == 1001 and listed["2000"]["relay"] is True
    assert listed["1"]["online"] is True and listed["1"]["region"] == "eu"
    assert snapshot["regions"] == {"eu": {"bytes_up": 5, "bytes_down": 7}}


def test_a_delta_carries_only_what_changed_and_then_nothing(live: LiveState) -> None:
    live.take_delta()  # the nodes seen at start
    assert live.take_delta() is None
    live.round_started(2, cohort_target=1000)
    live.phase(2, Phase.FIT, 0.5)
    for node_id in (1, 2, 3):
        live.task_settled(2, task(node_id, 2, down=100), Outcome("ok", bytes_up=10))
    delta = live.take_delta()
    assert delta is not None
    assert set(delta["clients"]) == {"1", "2", "3"}
    assert delta["current"]["settled"] == 3 and delta["current"]["phase"] == "fit"
    assert delta["current"]["phase_s"] == {"select": 0.5}
    assert delta["regions"] == {
        "eu": {"bytes_up": 25, "bytes_down": 207},
        "us": {"bytes_up": 10, "bytes_down": 100},
    }
    assert "rounds" not in delta and "run" not in delta
    assert live.take_delta() is None
    first = delta["seq"]
    live.task_settled(2, task(4, 2), Outcome("late"))
    later = live.take_delta()
    assert later is not None and later["seq"] == first + 1
    assert clients(later)["4"]["status"] == "late" and clients(later)["4"]["failures"] == 1


def test_an_ended_round_adds_one_round_and_moves_the_run_on(live: LiveState) -> None:
    live.round_started(2, cohort_target=2)
    record = RoundRecord(
        2,
        phase_durations={"fit": 1.0, "aggregate": 0.25},
        outcomes=[
            (task(1, 2, down=40), Outcome("ok", bytes_up=30)),
            (task(2, 2, down=40), Outcome("dropped")),
        ],
        train_loss=0.5,
        eval_metrics={"accuracy": 0.75, "note": "text", "flag": True},
    )
    live.take_delta()
    live.round_ended(record, "committed")
    delta = live.take_delta()
    assert delta is not None
    [row] = delta["rounds"]
    assert row["number"] == 2 and row["status"] == "committed"
    assert (row["bytes_up"], row["bytes_down"]) == (30, 80)
    assert (row["num_succeeded"], row["num_failed"]) == (1, 1)
    assert row["metrics"]["eval"] == {"accuracy": 0.75}  # numbers only: what charts plot
    assert delta["run"]["last_committed_round"] == 2
    assert delta["current"]["phase"] == "commit" and delta["current"]["ended"] is True
    assert [r["number"] for r in live.snapshot()["rounds"]] == [1, 2]


def test_a_failed_round_is_not_a_commit(live: LiveState) -> None:
    live.round_started(2, cohort_target=2)
    live.take_delta()
    live.round_failed(RoundRecord(2), "too few results")
    live.round_ended(RoundRecord(2), "failed: too few results")
    delta = live.take_delta()
    assert delta is not None and "run" not in delta and "aborts" not in delta
    assert delta["rounds"][0]["status"] == "failed"
    assert delta["rounds"][0]["error"] == "too few results"


def test_secure_aggregation_stages_and_aborts_are_counted(live: LiveState) -> None:
    live.round_started(2, cohort_target=3)
    for node_id, status in ((1, "ok"), (2, "ok"), (3, "dropped")):
        live.task_settled(2, task(node_id, 2, kind="advertise"), Outcome(status))  # type: ignore[arg-type]
    live.task_settled(2, task(1, 2, kind="share"), Outcome("ok"))
    live.round_failed(RoundRecord(2), secagg_abort_reason("share", "2 of 3 left"))
    delta = live.take_delta()
    assert delta is not None
    assert delta["current"]["stages"] == {"advertise": {"ok": 2, "dropped": 1}, "share": {"ok": 1}}
    assert delta["aborts"] == [
        {"round": 2, "stage": "share", "reason": secagg_abort_reason("share", "2 of 3 left")}
    ]


def test_measured_links_reach_their_clients(live: LiveState) -> None:
    live.take_delta()
    live.measurements(2, [LinkEstimate(5, rtt_s=0.2, down_bps=8e6, up_bps=1e6), LinkEstimate(5000)])
    delta = live.take_delta()
    assert delta is not None and set(delta["clients"]) == {"5"}  # node 5000 is unknown
    assert clients(delta)["5"]["rtt_s"] == 0.2 and clients(delta)["5"]["up_bps"] == 1e6


def test_a_link_shown_as_before_is_not_sent_again(live: LiveState) -> None:
    live.take_delta()
    live.measurements(2, [LinkEstimate(5, rtt_s=0.01234, down_bps=8e6), LinkEstimate(6, rtt_s=0.3)])
    first = live.take_delta()
    assert first is not None and clients(first)["5"]["rtt_s"] == 0.0123  # as the page shows it
    # Node 5 changes below what the page shows (0.1 ms), node 6 by 10 ms.
    live.measurements(
        3, [LinkEstimate(5, rtt_s=0.01231, down_bps=8e6), LinkEstimate(6, rtt_s=0.31)]
    )
    second = live.take_delta()
    assert second is not None and set(second["clients"]) == {"6"}
    assert clients(second)["6"]["rtt_s"] == 0.31


def test_nodes_that_leave_and_come_back_are_marked(nodes: Registry, live: LiveState) -> None:
    live.take_delta()
    session = next(s for s in nodes.online() if s.node_id == 7)
    session.online = False
    live.recount_nodes()
    delta = live.take_delta()
    assert delta is not None and delta["clients"] == {"7": live.snapshot()["clients"]["7"]}
    assert clients(delta)["7"]["online"] is False
    session.online = True
    live.recount_nodes()
    again = live.take_delta()
    assert again is not None and clients(again)["7"]["online"] is True


def test_the_end_of_the_run_is_shown(live: LiveState) -> None:
    live.take_delta()
    live.finish("completed")
    delta = live.take_delta()
    assert delta is not None and delta["run"]["status"] == "completed"
    assert live.snapshot()["runs"][0]["status"] == "completed"


def test_a_stream_that_falls_behind_is_ended_and_the_others_go_on(live: LiveState) -> None:
    from geofl.server.dashboard.app import MAX_BACKLOG, Broadcaster

    async def scenario() -> tuple[list[bytes | None], list[bytes | None]]:
        broadcaster = Broadcaster(live)
        slow, first = broadcaster.open()
        fast, _ = broadcaster.open()
        assert first.startswith(b"event: snapshot\n")
        received: list[bytes | None] = []
        for number in range(MAX_BACKLOG + 1):
            live.round_started(number + 2, cohort_target=1)
            broadcaster.publish()
            received.append(fast.get_nowait())
        backlog = [slow.get_nowait() for _ in range(slow.qsize())]
        live.round_started(1000, cohort_target=1)
        broadcaster.publish()  # the slow stream is no longer sent to
        assert slow.empty() and fast.qsize() == 1
        return received, backlog

    received, backlog = asyncio.run(scenario())
    assert len(received) == MAX_BACKLOG + 1 and all(m and b"event: delta" in m for m in received)
    assert backlog[-1] is None and len(backlog) == MAX_BACKLOG  # its stream ends there


def test_registry_changes_wait_for_a_recount_the_dashboard_asks_for(
    nodes: Registry, live: LiveState
) -> None:
    async def scenario() -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        live.take_delta()
        nodes.add(3000, "late-joiner", "eu", {})  # on the loop: only noted
        before = live.take_delta()
        await asyncio.to_thread(live.request_recount)  # as the dashboard's thread does
        for _ in range(3):
            await asyncio.sleep(0)
        return before, live.take_delta()

    before, after = asyncio.run(scenario())
    assert before is None
    assert after is not None and clients(after)["3000"]["name"] == "late-joiner"
