"""The round core's parts on their own: observers, the change signal, the task runner."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from geofl.protocols.types import WeightsView
from geofl.server.config import parse_config
from geofl.server.models.store import ModelStore
from geofl.server.nodes.clock import LoopClock
from geofl.server.nodes.outcomes import DeltaUpdate, Outcome
from geofl.server.nodes.registry import NodeSession, Registry, TaskRecord
from geofl.server.rounds.factory import make_engine
from geofl.server.rounds.fedbuff import FedBuffEngine
from geofl.server.rounds.observers import Observers, RoundEndCallback, RoundObserver
from geofl.server.rounds.parts import EngineParts
from geofl.server.rounds.records import EngineSettings, RoundRecord
from geofl.server.rounds.sync import SyncEngine
from geofl.server.rounds.tasks import TaskRunner, fold_update
from geofl.server.simulation.virtual_loop import run_virtual
from geofl.server.strategies import UpdateRejected, make_strategy


class Journal(RoundObserver):
    """Writes every event it hears, tagged with its name."""

    def __init__(self, name: str, log: list[tuple[str, str, Any]]) -> None:
        self._name, self._log = name, log

    def round_started(self, number: int, cohort_target: int) -> None:
        self._log.append((self._name, "started", number))

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        self._log.append((self._name, "task", (task.task_id, outcome.status)))

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        self._log.append((self._name, "committed", record.number))

    def round_ended(self, record: RoundRecord, status: str) -> None:
        self._log.append((self._name, "ended", status))


def test_every_observer_hears_every_event_in_the_order_given() -> None:
    log: list[tuple[str, str, Any]] = []
    ended: list[tuple[int, str]] = []
    observers = Observers([Journal("db", log), Journal("display", log)])
    observers.subscribe(RoundEndCallback(lambda record, status: ended.append((1, status))))
    observers.round_started(3, 10)
    asyncio.run(observers.round_committed(RoundRecord(3), {}, {}))
    observers.round_ended(RoundRecord(3), "committed")
    assert log == [
        ("db", "started", 3),
        ("display", "started", 3),
        ("db", "committed", 3),
        ("display", "committed", 3),
        ("db", "ended", "committed"),
        ("display", "ended", "committed"),
    ]
    assert ended == [(1, "committed")]


def test_the_change_signal_reaches_every_subscriber_until_it_unsubscribes() -> None:
    async def main() -> tuple[int, int]:
        registry = Registry(1.0)
        engine_seen, hub_seen = [], []
        unsubscribe = registry.changes.subscribe(lambda: engine_seen.append(1))
        registry.changes.subscribe(lambda: hub_seen.append(1))
        registry.add(1, "a", None, {})
        unsubscribe()
        registry.add(2, "b", None, {})
        return len(engine_seen), len(hub_seen)

    assert asyncio.run(main()) == (1, 2)


class Simulated:
    """Simulated nodes: take every task at once; node 2 is away."""

    def __init__(self) -> None:
        self.delivered: list[tuple[int, int]] = []

    def deliver(self, session: NodeSession, task: TaskRecord) -> None:
        self.delivered.append((session.node_id, task.task_id))

    def is_present(self, session: NodeSession) -> bool:
        return session.node_id != 2


def test_attached_simulated_nodes_take_delivery_and_say_who_is_online() -> None:
    async def main() -> None:
        registry = Registry(1.0)
        nodes = Simulated()
        for node in (1, 2):
            registry.add(node, f"n{node}", None, {})
        registry.attach(nodes)
        gone = registry.expire()
        assert [s.node_id for s in gone] == [2]
        session = registry.available()[0]
        task = registry.assign(session, "fit", 1, 0, {}, 1e12)
        assert nodes.delivered == [(1, task.task_id)]
        assert session.mailbox.empty()  # not through the mailbox networked nodes poll
        with pytest.raises(RuntimeError, match="attach once"):
            registry.attach(Simulated())

    asyncio.run(main())


def _runner(registry: Registry, journal: RoundObserver) -> TaskRunner:
    clock = LoopClock(asyncio.get_running_loop())
    return TaskRunner(registry, journal, clock=clock, deadline_s=30.0)


def test_the_runner_settles_results_failures_and_the_deadline_in_one_place() -> None:
    log: list[tuple[str, str, Any]] = []

    async def main() -> tuple[list[Outcome], RoundRecord, TaskRunner]:
        registry = Registry(1.0, clock=LoopClock(asyncio.get_running_loop()))
        for node in (1, 2, 3, 4):
            registry.add(node, f"n{node}", None, {})
        runner = _runner(registry, Journal("db", log))
        record = RoundRecord(5)
        tasks = runner.dispatch(registry.available(), "fit", 5, 4, {"lr": 0.1})
        assert {t.config["server_round"] for t in tasks} == {5}
        assert runner.holders[4] == 4
        tasks[0].settle(Outcome("ok", num_examples=10))
        tasks[1].settle(Outcome("ok", num_examples=20))
        tasks[2].settle(Outcome("failed", "client error"))
        # tasks[3] never answers: the deadline settles it

        async def refuse_twenty(task: TaskRecord, outcome: Outcome) -> Outcome:
            if outcome.num_examples == 20:
                outcome.refuse("rejected", "too many")
            return outcome

        good = await runner.settle(
            tasks, lambda t, o: runner.record(record, t, o), take_ok=refuse_twenty
        )
        return good, record, runner

    good, record, runner = run_virtual(main())
    assert [o.num_examples for o in good] == [10]
    statuses = sorted(o.status for _, o in record.outcomes)
    assert statuses == ["failed", "late", "ok", "rejected"]
    assert sorted(entry[2][1] for entry in log) == statuses  # each observed once
    assert not runner.in_flight and runner.holders[4] == 0


def test_a_refused_update_is_freed_and_names_the_reason() -> None:
    closed: list[bool] = []
    update = DeltaUpdate({"w": np.ones(2, np.float32)}, lambda: closed.append(True))

    def refuse(tensors: WeightsView, weight: float) -> None:
        raise UpdateRejected("w has the wrong norm")

    outcome = asyncio.run(fold_update(Outcome("ok", num_examples=3, payload=update), refuse))
    assert (outcome.status, outcome.reason) == ("rejected", "w has the wrong norm")
    assert closed == [True] and outcome.payload is None


@pytest.mark.parametrize(
    ("mode", "engine"), [("sync", SyncEngine), ("diloco", SyncEngine), ("async", FedBuffEngine)]
)
def test_the_factory_picks_the_engine_the_schedule_asks_for(mode: str, engine: type) -> None:
    config = parse_config(
        {"run": {"name": "x", "rounds": 2}, "model": "m:f", "schedule": {"mode": mode}}, "t"
    )
    parts = EngineParts(
        registry=Registry(1.0),
        strategy=make_strategy("fedavg"),
        models=ModelStore(),
        observer=RoundObserver(),
        start_round=1,
        weights={"w": np.zeros(2, np.float32)},
    )
    made = make_engine(EngineSettings.from_config(config), parts, config.schedule)
    assert type(made) is engine
    assert type(make_engine(EngineSettings.from_config(config), parts)) is SyncEngine
