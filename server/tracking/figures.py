"""What a tracker receives: the run's configuration once, then each round's figures.

:class:`RoundFigures` is the one round observer of experiment tracking. It sums a round's
settled tasks (participations, bytes by direction and region) and, when the round ends,
hands one flat ``{name: number}`` mapping to every :class:`Tracker`: MLflow metrics and
TensorBoard scalars get the same names, so the two tools show the same run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from geofl.protocols.types import Metrics, WeightsView
from geofl.server.nodes.clock import WALL_CLOCK, Clock
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import Registry, TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord

__all__ = ["NO_REGION", "RoundFigures", "RunIdentity", "Tracker", "flatten_config"]

log = logging.getLogger(__name__)

#: Region of nodes that named none (as in the Prometheus metrics).
NO_REGION = "none"


@dataclass(frozen=True)
class RunIdentity:
    """The geofl run a tracker records: its database id, name and configuration."""

    run_id: int
    run_name: str
    config_sha256: str
    config: Mapping[str, Any]


class Tracker(Protocol):
    """An experiment tracker; a failing tracker logs a warning, it never stops the run."""

    def log_round(self, number: int, figures: Mapping[str, float], unix_s: float) -> None:
        """Record round ``number``'s figures, dated ``unix_s`` (simulated on that clock)."""

    def finish(self, status: str) -> None:
        """The run ended with ``status`` (completed, failed, interrupted...); flush, close."""


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"server.address": "127.0.0.1:8443", ...}``: the configuration as flat text pairs."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, f"{name}."))
        else:
            flat[name] = "null" if value is None else str(value)
    return flat


class _Round:
    """Sums of one round's settled tasks."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.tasks: dict[str, int] = {}
        self.bytes: dict[str, float] = {}

    def add(self, key: str, amount: float) -> None:
        self.bytes[key] = self.bytes.get(key, 0.0) + amount


def _numbers(prefix: str, values: Metrics) -> dict[str, float]:
    return {
        f"{prefix}/{name}": float(value)
        for name, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


class RoundFigures(RoundObserver):
    """Turns each round into one mapping of figures for ``trackers``."""

    def __init__(
        self, trackers: Sequence[Tracker], registry: Registry, clock: Clock = WALL_CLOCK
    ) -> None:
        self._trackers = list(trackers)
        self._registry = registry
        self._clock = clock
        self._rounds: dict[int, _Round] = {}
        self._regions: dict[int, str] = {}

    def round_started(self, number: int, cohort_target: int) -> None:
        self._rounds[number] = _Round(self._clock.monotonic())

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        tally = self._rounds.get(number)
        if tally is None:
            return
        key = f"{task.kind}_{outcome.status}"
        tally.tasks[key] = tally.tasks.get(key, 0) + 1
        region = self._region_of(task.node_id)
        for direction, wire, raw in (
            ("up", outcome.bytes_up, outcome.bytes_up_raw),
            ("down", task.bytes_down, task.bytes_down_raw),
        ):
            tally.add(f"bytes/{direction}", wire)
            tally.add(f"bytes/{direction}_raw", raw)
            tally.add(f"bytes_by_region/{region}/{direction}", wire)

    def _region_of(self, node_id: int) -> str:
        region = self._regions.get(node_id)
        if region is None:
            for session in self._registry.online():
                self._regions[session.node_id] = session.region or NO_REGION
            region = self._regions.setdefault(node_id, NO_REGION)
        return region

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        """Nothing: the figures go out when the round has ended, committed or not."""

    def round_ended(self, record: RoundRecord, status: str) -> None:
        tally = self._rounds.pop(record.number, None)
        figures = self.figures(record, status, tally)
        unix_s = self._clock.time()
        for tracker in self._trackers:
            try:
                tracker.log_round(record.number, figures, unix_s)
            except Exception as exc:  # a tracker's outage must not end the run
                log.warning("tracker %s: round %d not logged: %s", tracker, record.number, exc)

    def figures(self, record: RoundRecord, status: str, tally: _Round | None) -> dict[str, float]:
        """Round ``record``'s figures: status, duration, phases, losses, metrics, bytes."""
        figures: dict[str, float] = {"round/committed": 1.0 if status == "committed" else 0.0}
        if tally is not None:
            figures["round/duration_s"] = self._clock.monotonic() - tally.started
            figures.update({f"tasks/{key}": float(n) for key, n in tally.tasks.items()})
            figures.update(tally.bytes)
        figures.update({f"phase/{name}_s": s for name, s in record.phase_durations.items()})
        for source, loss, values in (
            ("train", record.train_loss, record.fit_metrics),
            ("eval", record.eval_loss, record.eval_metrics),
            ("server_eval", record.server_eval_loss, record.server_eval_metrics),
        ):
            if loss is not None:
                figures[f"loss/{source}"] = loss
            figures.update(_numbers(source, values))
        return figures

    def finish(self, status: str) -> None:
        """Tell every tracker the run ended with ``status``."""
        for tracker in self._trackers:
            try:
                tracker.finish(status)
            except Exception as exc:
                log.warning("tracker %s did not close cleanly: %s", tracker, exc)
