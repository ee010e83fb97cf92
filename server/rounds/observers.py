"""What the engines tell the world: one observer protocol, any number of subscribers.

The database recorder, the progress display, a relay's memory of its regional rounds and
the simulation's summary all subscribe to the same events. An observer overrides what it
watches; every default does nothing (as :class:`asyncio.Protocol` does). Observers are
called in the order they were given, so the recorder, listed first, has committed a round
before a display reports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from geofl.protocols.types import WeightsView
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.scheduling.measurements import LinkEstimate

if TYPE_CHECKING:  # records imports this module for the phase clock's observer
    from geofl.server.rounds.records import Phase, RoundRecord


class RoundObserver:
    """Events of a run's rounds, in the order they happen."""

    def round_started(self, number: int, cohort_target: int) -> None:
        """Round ``number`` begins, aiming at ``cohort_target`` clients."""

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        """The round entered ``phase`` after ``seconds_in_previous`` in the one before."""

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        """One task of round ``number`` settled (result, failure, deadline or drop)."""

    def task_revised(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        """A settled task's status or reason changed at aggregation: a robust rule left its
        update out, or cut it down, once it had seen the whole round."""

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        """The round produced ``weights`` (and the strategy's ``state``); persist it here."""

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        """The round failed; nothing was applied (persist the failure here)."""

    def round_ended(self, record: RoundRecord, status: str) -> None:
        """The round is over: ``status`` is ``"committed"`` or ``"failed: <reason>"``.

        Called after :meth:`round_committed` or :meth:`round_failed` has returned for
        every observer: what displays and reports listen to.
        """

    def plan(self, number: int, message: str, data: dict[str, Any]) -> None:
        """The scheduler's plan for round ``number``: predictions per client, any fallback."""

    def measurements(self, number: int, estimates: Sequence[LinkEstimate]) -> None:
        """The link estimates after round ``number``."""


class Observers(RoundObserver):
    """Several observers as one: each event goes to every one of them, in order."""

    def __init__(self, observers: Iterable[RoundObserver] = ()) -> None:
        self._observers = list(observers)

    def subscribe(self, observer: RoundObserver) -> None:
        """Add ``observer`` after the others."""
        self._observers.append(observer)

    def round_started(self, number: int, cohort_target: int) -> None:
        for observer in self._observers:
            observer.round_started(number, cohort_target)

    def phase(self, number: int, phase: Phase, seconds_in_previous: float | None) -> None:
        for observer in self._observers:
            observer.phase(number, phase, seconds_in_previous)

    def task_settled(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        for observer in self._observers:
            observer.task_settled(number, task, outcome)

    def task_revised(self, number: int, task: TaskRecord, outcome: Outcome) -> None:
        for observer in self._observers:
            observer.task_revised(number, task, outcome)

    async def round_committed(
        self, record: RoundRecord, weights: WeightsView, state: WeightsView
    ) -> None:
        for observer in self._observers:
            await observer.round_committed(record, weights, state)

    def round_failed(self, record: RoundRecord, reason: str) -> None:
        for observer in self._observers:
            observer.round_failed(record, reason)

    def round_ended(self, record: RoundRecord, status: str) -> None:
        for observer in self._observers:
            observer.round_ended(record, status)

    def plan(self, number: int, message: str, data: dict[str, Any]) -> None:
        for observer in self._observers:
            observer.plan(number, message, data)

    def measurements(self, number: int, estimates: Sequence[LinkEstimate]) -> None:
        for observer in self._observers:
            observer.measurements(number, estimates)


class RoundEndCallback(RoundObserver):
    """An observer of one event: ``callback(record, status)`` when each round ends."""

    def __init__(self, callback: Callable[[RoundRecord, str], None]) -> None:
        self._callback = callback

    def round_ended(self, record: RoundRecord, status: str) -> None:
        self._callback(record, status)


__all__ = ["Observers", "RoundEndCallback", "RoundObserver"]
