"""The run's privacy budget: ε after each round, and the stop before one that would exceed it.

ε after round ``n`` is that of ``n`` rounds of the run's mechanism: failed rounds count as
spent too (the server may have released nothing for them, but counting them keeps the
figure an upper bound, and a resumed run's ε the same as if it had not stopped).
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

    def _compute(self, rounds: int) -> float:
        return epsilon(self.mechanism, rounds, self.delta)

    def epsilon_after(self, rounds: int) -> float:
        """ε after ``rounds`` rounds (cached: the accountant takes milliseconds)."""
        return self._epsilon(rounds)

    def over_budget(self, rounds: int) -> str | None:
        """Why round ``rounds`` may not run (it would take ε over the target), or None."""
        if self.target is None:
            return None
        spent = self.epsilon_after(rounds)
        if spent <= self.target * (1 + 1e-9):
            return None
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
