"""A round's accumulator together with what its rule made of each update it folded.

A robust rule answers every ``add`` with an :class:`UpdateCheck`. A rule that decides on
arrival (a norm bound) has filled it in by then, and :func:`fold_update` puts its reason on
the outcome before the participation is recorded. A rule that must see every update
(Krum, trimmed mean) fills the checks in when the mean is taken; :meth:`Aggregation.revise`
then carries each verdict to its outcome (a left-out update becomes ``rejected``) and tells
the observers, so the recorded participation is rewritten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from geofl.protocols.types import Weights, WeightsView
from geofl.server.nodes.outcomes import Outcome
from geofl.server.nodes.registry import TaskRecord
from geofl.server.rounds.observers import RoundObserver
from geofl.server.strategies import StrategyError, StreamingMean, UpdateCheck

__all__ = ["Aggregation", "Fold"]

#: Folds one update with its weight; returns the rule's check of it, if any.
Fold = Callable[[WeightsView, float], UpdateCheck | None]


class Aggregation:
    """One round's accumulator and the checks of the updates folded into it."""

    def __init__(self, accumulator: StreamingMean) -> None:
        self._accumulator: StreamingMean | None = accumulator
        self._checked: list[tuple[TaskRecord, Outcome, UpdateCheck]] = []
        self._lock = threading.Lock()

    def folder(self, task: TaskRecord, outcome: Outcome) -> Fold:
        """How ``task``'s update is folded: into the accumulator, its check kept."""

        def add(update: WeightsView, weight: float) -> UpdateCheck | None:
            check = self._open().add(update, weight)
            if check is not None:
                with self._lock:
                    self._checked.append((task, outcome, check))
            return check

        return add

    def mean(self) -> Weights:
        """The accumulator's mean (a robust rule's aggregate; its checks are filled in)."""
        return self._open().mean()

    def revise(self, number: int, observer: RoundObserver) -> int:
        """After the mean: give each used outcome its rule's final verdict; return how many
        changed (each one is told to ``observer.task_revised``)."""
        changed = 0
        for task, outcome, check in self._checked:
            if outcome.status != "ok":
                continue
            if check.used and check.reason == outcome.reason:
                continue
            outcome.reason = check.reason
            if not check.used:
                outcome.status = "rejected"
            observer.task_revised(number, task, outcome)
            changed += 1
        return changed

    def close(self) -> None:
        """Drop the accumulator (its float64 sums are twice the model) and free what it
        holds outside memory (a robust rule's spilled files). Safe to call again."""
        if self._accumulator is not None:
            self._accumulator.close()
            self._accumulator = None

    def _open(self) -> StreamingMean:
        if self._accumulator is None:
            raise StrategyError("the round's accumulator was already closed")
        return self._accumulator
