"""plan_cohort: deadline cut, exploration, fairness, Oort weighting, fallback, determinism."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geofl.server.scheduling.planner import (
    Candidate,
    Plan,
    PlannerSettings,
    plan_cohort,
    statistical_utility,
)

SETTINGS = settings(max_examples=150, deadline=None)
REGIONS = ("eu", "us", "ap", None)
ROUND = 7


@st.composite
def candidate_lists(draw: st.DrawFn) -> list[Candidate]:
    """0-30 candidates with unique ids, some unmeasured, some without utility."""
    ids = draw(st.lists(st.integers(0, 10_000), max_size=30, unique=True))
    return [
        Candidate(
            node_id=node,
            region=draw(st.sampled_from(REGIONS)),
            predicted_s=draw(st.none() | st.floats(0, 200)),
            utility=draw(st.none() | st.floats(0, 1000)),
            last_round=draw(st.none() | st.integers(0, ROUND)),
        )
        for node in ids
    ]


planner_settings = st.builds(
    PlannerSettings,
    target=st.integers(1, 12),
    over_select=st.floats(1, 2),
    deadline_s=st.floats(1, 150),
    fairness=st.sampled_from(["none", "proportional", "min_per_region"]),
    min_per_region=st.integers(1, 3),
    utility=st.booleans(),
    exploration=st.floats(0, 1),
    speed_penalty_alpha=st.floats(0, 3),
    margin=st.floats(0.5, 1),
    preferred_quantile=st.floats(0.01, 1),
)


def _late(candidate: Candidate, config: PlannerSettings) -> bool:
    return candidate.predicted_s is not None and candidate.predicted_s > config.cutoff_s


def _eligible(candidates: list[Candidate], config: PlannerSettings) -> list[Candidate]:
    return [c for c in candidates if not _late(c, config)]


def _plan(candidates: list[Candidate], config: PlannerSettings, seed: int = 0) -> Plan:
    return plan_cohort(candidates, config, random.Random(seed), ROUND)


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_cohort_is_a_duplicate_free_subset_of_the_right_size(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    plan = _plan(candidates, config, seed)
    by_id = {c.node_id: c for c in candidates}
    assert len(set(plan.node_ids)) == len(plan.node_ids)
    assert set(plan.node_ids) <= set(by_id)
    assert len(plan.selected) == min(config.cohort_size, len(candidates))
    for chosen in plan.selected:
        assert (chosen.region, chosen.predicted_s) == (
            by_id[chosen.node_id].region,
            by_id[chosen.node_id].predicted_s,
        )


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_reasons_match_predictions(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    plan = _plan(candidates, config, seed)
    by_id = {c.node_id: c for c in candidates}
    for chosen in plan.selected:
        source = by_id[chosen.node_id]
        if chosen.reason == "fits":
            assert chosen.predicted_s is not None
            assert chosen.predicted_s <= config.margin * config.deadline_s
            assert not (config.utility and source.utility is None)
        elif chosen.reason == "explore":
            assert chosen.predicted_s is None or (config.utility and source.utility is None)
            assert not _late(source, config)
        else:
            assert _late(source, config)


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_late_clients_only_fill_what_eligible_ones_cannot(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    plan = _plan(candidates, config, seed)
    size = min(config.cohort_size, len(candidates))
    eligible = _eligible(candidates, config)
    late_chosen = [c for c in plan.selected if c.reason == "fallback-fastest"]
    assert len(late_chosen) == max(0, size - len(eligible))
    assert (plan.fallback is None) == (not late_chosen)
    late_total = sum(_late(c, config) for c in candidates)
    assert plan.excluded_late == late_total - len(late_chosen)
    # The late ones chosen are the fastest late ones.
    chosen_ids = set(plan.node_ids)
    left_out = [
        c.predicted_s or 0.0 for c in candidates if _late(c, config) and c.node_id not in chosen_ids
    ]
    if late_chosen and left_out:
        assert max(c.predicted_s or 0.0 for c in late_chosen) <= min(left_out)


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_same_seed_same_plan(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    assert _plan(candidates, config, seed) == _plan(candidates, config, seed)


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_proportional_fairness_keeps_region_shares(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    config = replace(config, fairness="proportional")
    plan = _plan(candidates, config, seed)
    size = len(plan.selected)
    available = Counter(c.region for c in candidates)
    eligible = Counter(c.region for c in _eligible(candidates, config))
    got = Counter(c.region for c in plan.selected)
    all_served = all(
        eligible[r] >= math.ceil(size * n / len(candidates)) for r, n in available.items()
    )
    for region, count in available.items():
        share = size * count / len(candidates)
        assert got[region] >= min(math.floor(share), eligible[region])
        if all_served:
            assert got[region] <= math.ceil(share)
    if all_served:
        assert plan.starved_regions == ()


@SETTINGS
@given(candidate_lists(), planner_settings, st.integers(0, 2**32))
def test_min_per_region_guarantee(
    candidates: list[Candidate], config: PlannerSettings, seed: int
) -> None:
    config = replace(config, fairness="min_per_region")
    plan = _plan(candidates, config, seed)
    available = Counter(c.region for c in candidates)
    eligible = Counter(c.region for c in _eligible(candidates, config))
    got = Counter(c.region for c in plan.selected)
    if len(available) * config.min_per_region <= len(plan.selected):
        for region in available:
            assert got[region] >= min(config.min_per_region, eligible[region])
    starved = {r for r in available if got[r] < min(config.min_per_region, available[r])}
    assert set(plan.starved_regions) == starved
    assert len(plan.notes) == len(plan.starved_regions)


def _regional(counts: dict[str, int]) -> list[Candidate]:
    regions = [region for region, count in counts.items() for _ in range(count)]
    return [Candidate(i, region, 1.0, None, None) for i, region in enumerate(regions)]


def test_proportional_cohort_mirrors_the_regions() -> None:
    config = PlannerSettings(target=10, over_select=1.0, deadline_s=10, fairness="proportional")
    candidates = _regional({"eu": 12, "us": 6, "ap": 2})
    for seed in range(30):
        got = Counter(c.region for c in _plan(candidates, config, seed).selected)
        assert got == {"eu": 6, "us": 3, "ap": 1}


def test_min_per_region_serves_a_small_region_every_time() -> None:
    config = PlannerSettings(
        target=4, over_select=1.0, deadline_s=10, fairness="min_per_region", min_per_region=2
    )
    candidates = _regional({"eu": 18, "ap": 2})
    for seed in range(30):
        got = Counter(c.region for c in _plan(candidates, config, seed).selected)
        assert got["ap"] == 2


def test_starved_region_is_reported_not_filled_with_late_clients() -> None:
    candidates = [
        *(Candidate(i, "eu", 5.0, None, None) for i in range(6)),
        Candidate(100, "ap", 50.0, None, None),
    ]
    config = PlannerSettings(target=3, over_select=1.0, deadline_s=10, fairness="min_per_region")
    plan = _plan(candidates, config)
    assert 100 not in plan.node_ids
    assert plan.starved_regions == ("ap",)
    assert plan.notes == (
        "region 'ap' got 0 of the 1 clients that fairness (min_per_region) reserves it: "
        "only 0 of its clients are predicted to finish within 9 s or unmeasured",
    )


def test_a_cohort_too_small_for_every_region_says_so() -> None:
    candidates = [Candidate(i, region, 1.0, None, None) for i, region in enumerate("abc")]
    config = PlannerSettings(target=2, over_select=1.0, deadline_s=10, fairness="min_per_region")
    plan = _plan(candidates, config)
    assert len(plan.starved_regions) == 1
    assert plan.notes[0].endswith("the cohort is too small to reserve clients for every region")
    assert plan.fallback is None


def test_no_client_in_time_falls_back_to_the_fastest_and_says_so() -> None:
    times = {1: 100.0, 2: 50.0, 3: 70.0, 4: 200.0}
    candidates = [Candidate(i, "eu", t, None, None) for i, t in times.items()]
    config = PlannerSettings(target=2, over_select=1.0, deadline_s=10)
    plan = _plan(candidates, config)
    assert plan.node_ids == (2, 3)
    assert {c.reason for c in plan.selected} == {"fallback-fastest"}
    assert plan.excluded_late == 2
    assert plan.fallback == (
        "no client is predicted to finish within the deadline of 10 s "
        "(x0.9 safety margin = 9 s); chose the 2 fastest (predicted 50-70 s)"
    )


def test_too_few_in_time_tops_up_with_the_fastest_late_client() -> None:
    candidates = [
        Candidate(1, "eu", 3.0, None, None),
        Candidate(2, "eu", 30.0, None, None),
        Candidate(3, "eu", 20.0, None, None),
    ]
    plan = _plan(candidates, PlannerSettings(target=2, over_select=1.0, deadline_s=10))
    assert plan.node_ids == (1, 3)
    assert [c.reason for c in plan.selected] == ["fits", "fallback-fastest"]
    assert plan.fallback is not None
    assert plan.fallback.startswith("only 1 of the 2 clients needed")
    assert plan.excluded_late == 1


def test_over_selection_rounds_up() -> None:
    assert PlannerSettings(target=10, over_select=1.2, deadline_s=1).cohort_size == 12
    assert PlannerSettings(target=3, over_select=1.1, deadline_s=1).cohort_size == 4
    assert PlannerSettings(target=3, over_select=1.0, deadline_s=1).cohort_size == 3


def test_first_round_explores_everyone() -> None:
    candidates = [Candidate(i, "eu", None, None, None) for i in range(20)]
    plan = plan_cohort(
        candidates,
        PlannerSettings(target=5, over_select=1.0, deadline_s=10, utility=True),
        random.Random(1),
        1,
    )
    assert len(plan.selected) == 5
    assert {c.reason for c in plan.selected} == {"explore"}


def test_exploration_takes_its_share_of_the_cohort() -> None:
    fits = [Candidate(i, "eu", 1.0, 1.0, 1) for i in range(30)]
    new = [Candidate(100 + i, "eu", None, None, None) for i in range(30)]
    config = PlannerSettings(target=10, over_select=1.0, deadline_s=10, exploration=0.2)
    for seed in range(20):
        reasons = Counter(c.reason for c in _plan(fits + new, config, seed).selected)
        assert reasons == {"fits": 8, "explore": 2}


def _pick_rate(candidates: list[Candidate], config: PlannerSettings, node: int) -> float:
    draws = 2000
    hits = sum(node in _plan(candidates, config, seed).node_ids for seed in range(draws))
    return hits / draws


def test_utility_weighting_favours_high_utility_clients() -> None:
    # One client with ten times the others' utility, all equally fast, no bonus: with
    # weights 1 and 0.1, P(first pick) = 1 / (1 + 19 * 0.1) = 0.34; uniform is 0.05.
    candidates = [Candidate(i, "eu", 1.0, 10.0 if i == 0 else 1.0, None) for i in range(20)]
    config = PlannerSettings(target=1, over_select=1.0, deadline_s=10, exploration=0.0)
    weighted = _pick_rate(candidates, replace(config, utility=True), node=0)
    uniform = _pick_rate(candidates, config, node=0)
    assert 0.28 < weighted < 0.41
    assert 0.02 < uniform < 0.08


def test_speed_penalty_disfavours_slow_clients() -> None:
    # Equal utility; client 0 takes 8 s where T is 1 s: weight (1/8)^2 = 1/64.
    candidates = [Candidate(i, "eu", 8.0 if i == 0 else 1.0, 1.0, None) for i in range(4)]
    config = PlannerSettings(
        target=1, over_select=1.0, deadline_s=10, utility=True, exploration=0.0
    )
    assert _pick_rate(candidates, config, node=0) < 0.03
    no_penalty = replace(config, speed_penalty_alpha=0.0)
    assert _pick_rate(candidates, no_penalty, node=0) > 0.2


def test_staleness_bonus_lifts_clients_not_seen_for_long() -> None:
    # Zero statistical utility everywhere: only sqrt(0.1 ln R / L) separates them.
    candidates = [Candidate(i, "eu", 1.0, 0.0, 1 if i == 0 else ROUND) for i in range(10)]
    config = PlannerSettings(
        target=1, over_select=1.0, deadline_s=10, utility=True, exploration=0.0
    )
    # Weights 0.44 and 9 x 0.17: P(first pick) = 0.23.
    assert 0.17 < _pick_rate(candidates, config, node=0) < 0.3
    # Without the bonus every weight is zero: the order is uniform, not the input order.
    never_seen = [replace(c, last_round=None) for c in candidates]
    assert 0.06 < _pick_rate(never_seen, config, node=0) < 0.14


def test_statistical_utility() -> None:
    assert statistical_utility(100, 0.25) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="num_examples"):
        statistical_utility(-1, 1.0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"target": 0}, "target must be >= 1"),
        ({"over_select": 0.5}, "over_select must be a finite number >= 1"),
        ({"deadline_s": 0.0}, "deadline_s must be a finite number > 0"),
        ({"deadline_s": math.inf}, "deadline_s must be a finite number > 0"),
        ({"fairness": "equal"}, "fairness must be one of"),
        ({"fairness": "min_per_region", "min_per_region": 0}, "min_per_region must be >= 1"),
        ({"exploration": 1.5}, r"exploration must be in \[0, 1\]"),
        ({"speed_penalty_alpha": -1.0}, "speed_penalty_alpha"),
        ({"margin": 0.0}, r"margin must be in \(0, 1\]"),
        ({"preferred_quantile": 2.0}, "preferred_quantile"),
    ],
)
def test_bad_settings_are_refused(change: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"target": 2, "over_select": 1.0, "deadline_s": 10.0}
    with pytest.raises(ValueError, match=message):
        PlannerSettings(**{**base, **change})  # type: ignore[arg-type]


def test_bad_candidates_are_refused() -> None:
    config = PlannerSettings(target=2, over_select=1.0, deadline_s=10.0)
    with pytest.raises(ValueError, match=r"node ids more than once: \[3\]"):
        _plan([Candidate(3, "eu", 1.0, None, None)] * 2, config)
    with pytest.raises(ValueError, match="last_round 9 is after"):
        _plan([Candidate(3, "eu", 1.0, None, 9)], config)
    with pytest.raises(ValueError, match="node 3: predicted_s"):
        Candidate(3, "eu", -1.0, None, None)
    with pytest.raises(ValueError, match="node 3: utility"):
        Candidate(3, "eu", 1.0, math.nan, None)
    with pytest.raises(ValueError, match="round_number must be >= 1"):
        plan_cohort([], config, random.Random(0), 0)
