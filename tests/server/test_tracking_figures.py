"""Round figures for the trackers: names, sums, and a tracker that fails."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.records import RoundRecord
from geofl.server.tracking.figures import RoundFigures, flatten_config


class Recording:
    def __init__(self, fail: bool = False) -> None:
        self.rounds: list[tuple[int, dict[str, float]]] = []
        self.finished: list[str] = []
        self.fail = fail

    def log_round(self, number: int, figures: Mapping[str, float], unix_s: float) -> None:
        if self.fail:
            raise ConnectionError("tracking server unreachable")
        self.rounds.append((number, dict(figures)))

    def finish(self, status: str) -> None:
        if self.fail:
            raise ConnectionError("tracking server unreachable")
        self.finished.append(status)


def fit(node_id: int, down: int) -> TaskRecord:
    loop = asyncio.new_event_loop()
    try:
        future = loop.create_future()
    finally:
        loop.close()
    return TaskRecord(1, node_id, "fit", 1, 0, {}, 0.0, future, bytes_down=down)


def test_a_round_becomes_one_mapping_and_a_failing_tracker_is_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nodes = Registry(heartbeat_interval_s=1.0)
    nodes.add(1, "a", "eu", {})
    nodes.add(2, "b", None, {})
    broken, kept = Recording(fail=True), Recording()
    figures = RoundFigures([broken, kept], nodes)
    figures.round_started(1, 2)
    figures.task_settled(1, fit(1, 100), Outcome("ok", bytes_up=30, bytes_up_raw=60))
    figures.task_settled(1, fit(2, 100), Outcome("late"))
    record = RoundRecord(1, phase_durations={"fit": 2.5}, train_loss=0.75)
    record.fit_metrics.update({"accuracy": 0.5, "note": "text is not a figure", "flag": True})
    figures.round_ended(record, "committed")
    figures.finish("completed")
    [(number, logged)] = kept.rounds
    assert number == 1
    assert logged["round/committed"] == 1.0 and logged["phase/fit_s"] == 2.5
    assert logged["loss/train"] == 0.75 and logged["train/accuracy"] == 0.5
    assert "train/note" not in logged and "train/flag" not in logged
    assert logged["tasks/fit_ok"] == 1 and logged["tasks/fit_late"] == 1
    assert logged["bytes/up"] == 30 and logged["bytes/up_raw"] == 60
    assert logged["bytes/down"] == 200
    assert logged["bytes_by_region/eu/down"] == 100 and logged["bytes_by_region/none/down"] == 100
    assert kept.finished == ["completed"]
    assert "round 1 not logged: tracking server unreachable" in caplog.text


def test_the_config_flattens_to_dotted_names() -> None:
    flat = flatten_config({"run": {"name": "x", "rounds": 3}, "tls": None, "regions": {}})
    assert flat == {"run.name": "x", "run.rounds": "3", "tls": "null", "regions": "{}"}
