"""The run's privacy budget: ε after each round, and the stop before one that would exceed it.

ε after round ``n`` is that of ``n`` rounds of the run's mechanism: failed rounds count as
spent too (the server may have released nothing for them, but counting them keeps the
figure an upper bound, and a resumed run's ε the same as if it had not stopped).

The accountant's work (milliseconds without sampling, ~0.2 s a call with it) never runs on
the event loop: the coordinator calls :meth:`PrivacyLedger.plan` in a worker thread before
the first round, which finds the first planned round that would exceed the target (a
bisection: ε grows with the rounds, and the mechanism is fixed for the whole run, failed
rounds counted as spent), so the guard's check after each round is a comparison; the
recorder asks for each round's ε in a worker thread too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from geofl.server.privacy.accounting import AccountedMechanism, epsilon
from geofl.server.rounds.observers import RoundObserver
from geofl.server.rounds.records import RoundRecord

__all__ = ["BudgetGuard", "PrivacyLedger"]


class PrivacyLedger:
    """ε at ``delta`` after any number of rounds of ``mechanism``, and what a target allows.

    Parameters
    ----------
    mechanism
        One round, as the accountant sees it.
    delta
        The run's δ.
    target
        ``privacy.target_epsilon``, or None for no budget.
    """

    def __init__(self, mechanism: AccountedMechanism, delta: float, target: float | None) -> None:
        self.mechanism = mechanism
        self.delta = delta
        self.target = target
        self._epsilon = lru_cache(maxsize=None)(self._compute)
        #: (the planned rounds, the first of them over the target or None, its reason).
        self._plan: tuple[int, int | None, str | None] | None = None

    def _compute(self, rounds: int) -> float:
        return epsilon(self.mechanism, rounds, self.delta)

    def epsilon_after(self, rounds: int) -> float:
        """ε after ``rounds`` rounds (cached: the accountant takes milliseconds)."""
        return self._epsilon(rounds)

    def _fits(self, rounds: int) -> bool:
        assert self.target is not None
        return self.epsilon_after(rounds) <= self.target * (1 + 1e-9)

    def plan(self, planned_rounds: int) -> None:
        """Find, once, the first of rounds ``1..planned_rounds`` that would exceed the
        target (blocking accountant work: call it off the event loop, before the rounds).

        Afterwards :meth:`over_budget` answers for any round up to ``planned_rounds``
        without the accountant.
        """
        first: int | None = None
        if self.target is not None and not self._fits(planned_rounds):
            low, high = 0, planned_rounds  # low fits (ε(0) = 0), high does not
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if self._fits(middle) else (low, middle)
            first = high
        reason = None if first is None else self._reason(first)
        self._plan = (planned_rounds, first, reason)

    @property
    def planned(self) -> bool:
        """Whether :meth:`plan` has run."""
        return self._plan is not None

    def over_budget(self, rounds: int) -> str | None:
        """Why round ``rounds`` may not run (it would take ε over the target), or None.

        After :meth:`plan`, no accountant work for a planned round.
        """
        if self.target is None:
            return None
        if self._plan is not None and 1 <= rounds <= self._plan[0]:
            _, first, reason = self._plan
            if first is None or rounds < first:
                return None
            if rounds == first:
                return reason
            return (  # ε grows with the rounds: past the first round over, still over
                f"privacy budget reached: round {rounds} is past round {first}, the first "
                f"over privacy.target_epsilon {self.target} ({reason})"
            )
        if self._fits(rounds):
            return None
        return self._reason(rounds)

    def _reason(self, rounds: int) -> str:
        spent = self.epsilon_after(rounds)
        return (
            f"privacy budget reached: round {rounds} would spend ε={spent:.4g} at "
            f"δ={self.delta}, over privacy.target_epsilon {self.target} "
            f"(ε={self.epsilon_after(rounds - 1):.4g} after round {rounds - 1})"
        )


class BudgetGuard(RoundObserver):
    """Stops the run, after a committed round, when the next one would exceed the target.

    Parameters
    ----------
    ledger
        The run's ledger.
    planned_rounds
        The run's last round (no stop is needed after it).
    stop
        Called once with the reason (the coordinator records a ``privacy.budget_reached``
        event and stops the run after the current round).
    """

    def __init__(
        self, ledger: PrivacyLedger, planned_rounds: int, stop: Callable[[str], None]
    ) -> None:
        self._ledger = ledger
        self._planned = planned_rounds
        self._stop = stop
        self._stopped = False

    def round_ended(self, record: RoundRecord, status: str) -> None:
        """After any round (a failed one counts as spent), check the one after it."""
        following = record.number + 1
        if self._stopped or following > self._planned:
            return
        reason = self._ledger.over_budget(following)
        if reason is not None:
            self._stopped = True
            self._stop(reason)
