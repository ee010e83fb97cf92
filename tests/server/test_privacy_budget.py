"""The budget guard: stops once, after the last round that fits, never after the last round."""

from __future__ import annotations

import itertools

from geofl.server.privacy import RoundMechanism, epsilon
from geofl.server.privacy.budget import BudgetGuard, PrivacyLedger
from geofl.server.rounds.records import RoundRecord

MECHANISM = RoundMechanism(2.0)


def _target_between(low_rounds: int) -> float:
    return (epsilon(MECHANISM, low_rounds, 1e-5) + epsilon(MECHANISM, low_rounds + 1, 1e-5)) / 2


def _run_guard(ledger: PrivacyLedger, planned: int) -> list[tuple[int, str]]:
    stops: list[tuple[int, str]] = []
    current = 0

    guard = BudgetGuard(ledger, planned, lambda reason: stops.append((current, reason)))
    for current in range(1, planned + 1):
        guard.round_ended(RoundRecord(current), "committed")
    return stops


def test_stops_once_after_the_last_round_that_fits() -> None:
    ledger = PrivacyLedger(MECHANISM, 1e-5, _target_between(3))
    stops = _run_guard(ledger, 6)
    assert [number for number, _ in stops] == [3]
    assert stops[0][1].startswith("privacy budget reached: round 4 would spend")


def test_no_stop_when_every_planned_round_fits_or_there_is_no_target() -> None:
    assert _run_guard(PrivacyLedger(MECHANISM, 1e-5, _target_between(6)), 6) == []
    assert _run_guard(PrivacyLedger(MECHANISM, 1e-5, None), 6) == []


def test_ledger_matches_the_accountant_and_grows() -> None:
    ledger = PrivacyLedger(MECHANISM, 1e-5, None)
    spent = [ledger.epsilon_after(n) for n in range(6)]
    assert spent == [epsilon(MECHANISM, n, 1e-5) for n in range(6)]
    assert spent[0] == 0.0 and all(a < b for a, b in itertools.pairwise(spent))
