"""The budget guard: stops once, after the last round that fits, never after the last round."""

from __future__ import annotations

import itertools

import pytest

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


def _counting(ledger: PrivacyLedger) -> list[int]:
    """Record every round count the ledger asks the accountant for, from now on."""
    calls: list[int] = []
    compute = ledger._compute

    def counted(rounds: int) -> float:
        calls.append(rounds)
        return compute(rounds)

    ledger._compute = counted  # type: ignore[method-assign]
    ledger._epsilon.cache_clear()
    return calls


@pytest.mark.parametrize("fit", [0, 1, 3, 6, 9])
def test_a_planned_ledger_answers_every_planned_round_without_the_accountant(fit: int) -> None:
    planned = 9
    target = _target_between(fit) if fit > 0 else epsilon(MECHANISM, 1, 1e-5) / 2
    unplanned = PrivacyLedger(MECHANISM, 1e-5, target)
    expected = [unplanned.over_budget(n) is not None for n in range(1, planned + 1)]
    ledger = PrivacyLedger(MECHANISM, 1e-5, target)
    calls = _counting(ledger)
    ledger.plan(planned)
    assert ledger.planned and len(calls) <= 2 * planned.bit_length() + 2  # a bisection
    calls.clear()
    answers = [ledger.over_budget(n) for n in range(1, planned + 1)]
    assert calls == []
    assert [a is not None for a in answers] == expected == [n > fit for n in range(1, 10)]
    if fit < planned:
        assert answers[fit] == unplanned.over_budget(fit + 1)  # the same message
        assert answers[fit] is not None and f"round {fit + 1} would spend" in answers[fit]


def test_the_guard_after_planning_makes_no_accountant_call() -> None:
    ledger = PrivacyLedger(MECHANISM, 1e-5, _target_between(3))
    ledger.plan(6)
    calls = _counting(ledger)
    stops = _run_guard(ledger, 6)
    assert calls == [] and [number for number, _ in stops] == [3]
