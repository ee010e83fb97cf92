"""Deadline-aware cohort selection: a pure function over per-client measurements.

The model, in the order :func:`plan_cohort` applies it:

1. **Size.** The cohort is ``ceil(target * over_select)`` clients (at least ``target``;
   over-selection absorbs dropouts), or every candidate if there are fewer.
2. **Deadline.** A client's ``predicted_s`` is its predicted download + compute + upload.
   It *fits* when ``predicted_s <= margin * deadline_s``; the margin leaves room for
   prediction error. Clients predicted to be later are *late* and never chosen while
   eligible ones remain. Unmeasured clients (``predicted_s is None``) are eligible for
   exploration: their speed is unknown until they have taken part once.
3. **Preference.** Fitting clients are ranked uniformly at random or, with
   ``utility``, by Oort-style weighted sampling (Lai et al., OSDI '21): the statistical
   utility normalized by the largest one, plus Oort's temporal-uncertainty bonus
   ``sqrt(0.1 ln R / L)`` (``R`` this round, ``L`` the client's last round), times the
   system penalty ``(T / t)^alpha`` for clients slower than the preferred duration ``T``
   (the ``preferred_quantile`` quantile of the fitting clients' predictions). Exploration
   clients (unmeasured, or, with ``utility``, without a known utility) are ranked
   uniformly and interleaved so that about ``exploration`` of every prefix of the ranking
   is exploration while both kinds last.
4. **Fairness.** ``proportional`` reserves each region its largest-remainder share of
   the cohort by its share of candidates; ``min_per_region`` reserves ``min_per_region``
   clients for every region (round-robin when the cohort is too small for all). Only
   eligible clients fill a reservation; a region left short is reported in
   ``starved_regions`` and ``notes``. Reservations are filled from the ranking first,
   then the rest of the cohort in ranking order.
5. **Fallback.** If fewer clients are eligible than the cohort needs, the fastest late
   clients fill it (``fallback-fastest``) and ``fallback`` says so; with no eligible
   client at all this is the whole cohort.

Every random choice draws from the ``rng`` argument, so a plan is a function of the
candidates (in order), the settings, the generator's state and the round number.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "Candidate",
    "Fairness",
    "Plan",
    "PlannedClient",
    "PlannerSettings",
    "Reason",
    "plan_cohort",
    "statistical_utility",
]

Fairness = Literal["none", "proportional", "min_per_region"]
Reason = Literal["fits", "explore", "fallback-fastest"]
Region = str | None

#: Weight of Oort's temporal-uncertainty term (the paper's constant).
STALENESS_WEIGHT = 0.1


def _finite_at_least(name: str, value: float, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise ValueError(f"{name} must be a finite number >= {low:g}, got {value!r}")


@dataclass(frozen=True)
class Candidate:
    """An available client and what is known about it.

    Parameters
    ----------
    node_id
        The registry's node id; unique among the candidates of one plan.
    region
        The client's region (``None`` counts as a region of its own).
    predicted_s
        Predicted download + compute + upload seconds; ``None`` if never measured.
    utility
        Statistical utility from the client's last training (see
        :func:`statistical_utility`); ``None`` if it has not trained yet.
    last_round
        The last round the client trained in; ``None`` if never.
    """

    node_id: int
    region: Region
    predicted_s: float | None
    utility: float | None
    last_round: int | None

    def __post_init__(self) -> None:
        if self.predicted_s is not None:
            _finite_at_least(f"node {self.node_id}: predicted_s", self.predicted_s, 0.0)
        if self.utility is not None:
            _finite_at_least(f"node {self.node_id}: utility", self.utility, 0.0)
        if self.last_round is not None and self.last_round < 0:
            raise ValueError(f"node {self.node_id}: last_round must be >= 0, got {self.last_round}")


@dataclass(frozen=True)
class PlannerSettings:
    """How to choose a cohort (see the module docstring for the model).

    Parameters
    ----------
    target
        Updates the round needs.
    over_select
        Factor >= 1 on ``target`` to absorb dropouts.
    deadline_s
        Seconds the clients have from selection to their upload's arrival.
    fairness
        ``none``, ``proportional`` or ``min_per_region``.
    min_per_region
        Clients reserved per region under ``min_per_region`` (>= 1 there).
    utility
        Oort-style utility-weighted sampling instead of uniform sampling.
    exploration
        Share of the cohort, in [0, 1], given to unexplored clients while there are any.
    speed_penalty_alpha
        Exponent of the penalty ``(T / t)^alpha`` on clients slower than ``T``.
    margin
        Safety factor in (0, 1]: a client fits when predicted within ``margin * deadline_s``.
    preferred_quantile
        Quantile in (0, 1] of the fitting clients' predictions that sets ``T``; 1 makes
        the penalty vanish (then only the deadline cut counts speed).
    """

    target: int
    over_select: float
    deadline_s: float
    fairness: Fairness = "none"
    min_per_region: int = 1
    utility: bool = False
    exploration: float = 0.1
    speed_penalty_alpha: float = 2.0
    margin: float = 0.9
    preferred_quantile: float = 0.5

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ValueError(f"target must be >= 1, got {self.target}")
        _finite_at_least("over_select", self.over_select, 1.0)
        if not (math.isfinite(self.deadline_s) and self.deadline_s > 0):
            raise ValueError(f"deadline_s must be a finite number > 0, got {self.deadline_s!r}")
        if self.fairness not in get_args(Fairness):
            raise ValueError(
                f"fairness must be one of {list(get_args(Fairness))}, got {self.fairness!r}"
            )
        low = 1 if self.fairness == "min_per_region" else 0
        if self.min_per_region < low:
            raise ValueError(
                f"min_per_region must be >= {low} with fairness {self.fairness!r}, "
                f"got {self.min_per_region}"
            )
        _unit_interval("exploration", self.exploration, closed_low=True)
        _finite_at_least("speed_penalty_alpha", self.speed_penalty_alpha, 0.0)
        _unit_interval("margin", self.margin, closed_low=False)
        _unit_interval("preferred_quantile", self.preferred_quantile, closed_low=False)

    @property
    def cohort_size(self) -> int:
        """``ceil(target * over_select)``, ignoring float noise such as 10 * 1.2."""
        return max(self.target, math.ceil(self.target * self.over_select - 1e-9))

    @property
    def cutoff_s(self) -> float:
        """The latest predicted finish that still fits: ``margin * deadline_s``."""
        return self.margin * self.deadline_s


def _unit_interval(name: str, value: float, *, closed_low: bool) -> None:
    inside = 0 <= value <= 1 if closed_low else 0 < value <= 1
    if not (math.isfinite(value) and inside):
        bracket = "[0, 1]" if closed_low else "(0, 1]"
        raise ValueError(f"{name} must be in {bracket}, got {value!r}")


@dataclass(frozen=True)
class PlannedClient:
    """A chosen client, why it was chosen, and the time predicted for it (``None``: unknown)."""

    node_id: int
    region: Region
    predicted_s: float | None
    reason: Reason


@dataclass(frozen=True)
class Plan:
    """The cohort and what the planner had to concede.

    ``selected`` is in preference order. ``fallback`` explains late clients that were
    chosen because too few were eligible; ``excluded_late`` counts late clients left
    out; ``starved_regions`` lists regions that got fewer clients than fairness
    reserved them (too few eligible), each explained in ``notes``.
    """

    selected: tuple[PlannedClient, ...]
    fallback: str | None
    excluded_late: int
    starved_regions: tuple[Region, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The chosen node ids, in preference order."""
        return tuple(client.node_id for client in self.selected)


def statistical_utility(num_examples: int, mean_squared_loss: float) -> float:
    """Oort's statistical utility ``|B| * sqrt(mean of the squared per-sample losses)``.

    With only a mean loss ``l`` reported, ``l**2`` is a lower bound of the mean square
    (Jensen) and a fair stand-in.
    """
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    _finite_at_least("mean_squared_loss", mean_squared_loss, 0.0)
    return num_examples * math.sqrt(mean_squared_loss)


@dataclass(frozen=True)
class _Pools:
    fits: list[Candidate]
    unexplored: list[Candidate]
    late: list[Candidate]


def _partition(candidates: Sequence[Candidate], settings: PlannerSettings) -> _Pools:
    pools = _Pools([], [], [])
    for candidate in candidates:
        if candidate.predicted_s is not None and candidate.predicted_s > settings.cutoff_s:
            pools.late.append(candidate)
        elif candidate.predicted_s is None or (settings.utility and candidate.utility is None):
            pools.unexplored.append(candidate)
        else:
            pools.fits.append(candidate)
    return pools


def _check_candidates(candidates: Sequence[Candidate], round_number: int) -> None:
    if round_number < 1:
        raise ValueError(f"round_number must be >= 1, got {round_number}")
    counts = Counter(candidate.node_id for candidate in candidates)
    duplicates = sorted(node for node, count in counts.items() if count > 1)
    if duplicates:
        raise ValueError(f"candidates list node ids more than once: {duplicates}")
    for candidate in candidates:
        if candidate.last_round is not None and candidate.last_round > round_number:
            raise ValueError(
                f"node {candidate.node_id}: last_round {candidate.last_round} is after "
                f"the round being planned ({round_number})"
            )


def _preferred_s(fits: Sequence[Candidate], quantile: float) -> float:
    """Nearest-rank ``quantile`` of the fitting clients' predictions."""
    times = sorted(c.predicted_s for c in fits if c.predicted_s is not None)
    return times[max(0, math.ceil(quantile * len(times)) - 1)]


def _oort_weights(
    fits: Sequence[Candidate], settings: PlannerSettings, round_number: int
) -> list[float]:
    largest = max((c.utility or 0.0) for c in fits)
    preferred = _preferred_s(fits, settings.preferred_quantile)
    weights = []
    for candidate in fits:
        score = (candidate.utility or 0.0) / largest if largest > 0 else 0.0
        if candidate.last_round:
            score += math.sqrt(STALENESS_WEIGHT * math.log(round_number) / candidate.last_round)
        duration = candidate.predicted_s or 0.0
        if duration > preferred:
            score *= (preferred / duration) ** settings.speed_penalty_alpha
        weights.append(score)
    return weights


def _weighted_order(
    items: Sequence[Candidate], weights: Sequence[float], rng: random.Random
) -> list[Candidate]:
    """A random order where each next item is drawn with probability ∝ its weight.

    Efraimidis-Spirakis keys ``ln(u) / w``: sorting by them descending is weighted
    sampling without replacement. Zero weights go last, in uniformly random order.
    """
    keys: list[tuple[bool, float]] = []
    for weight in weights:
        u = 1.0 - rng.random()  # in (0, 1], so the log is finite
        keys.append((True, math.log(u) / weight) if weight > 0 else (False, u))
    ranked = sorted(range(len(items)), key=lambda i: keys[i], reverse=True)
    return [items[i] for i in ranked]


def _interleave(
    exploit: Sequence[Candidate], explore: Sequence[Candidate], share: float
) -> list[Candidate]:
    """Merge so that about ``share`` of every prefix is exploration while both last."""
    merged: list[Candidate] = []
    taken_explore = taken_exploit = 0
    while taken_explore < len(explore) or taken_exploit < len(exploit):
        wanted = math.floor(share * (len(merged) + 1) + 0.5)
        if taken_explore < len(explore) and (
            taken_explore < wanted or taken_exploit == len(exploit)
        ):
            merged.append(explore[taken_explore])
            taken_explore += 1
        else:
            merged.append(exploit[taken_exploit])
            taken_exploit += 1
    return merged


def _ranking(
    pools: _Pools, settings: PlannerSettings, rng: random.Random, round_number: int
) -> list[Candidate]:
    """Every eligible client, most preferred first."""
    if settings.utility and pools.fits:
        exploit = _weighted_order(
            pools.fits, _oort_weights(pools.fits, settings, round_number), rng
        )
    else:
        exploit = list(pools.fits)
        rng.shuffle(exploit)
    explore = list(pools.unexplored)
    rng.shuffle(explore)
    return _interleave(exploit, explore, settings.exploration)


def _largest_remainder(counts: dict[Region, int], seats: int) -> dict[Region, int]:
    total = sum(counts.values())
    quotas = {region: seats * count / total for region, count in counts.items()}
    seats_of = {region: int(quota) for region, quota in quotas.items()}
    left = seats - sum(seats_of.values())
    by_remainder = sorted(quotas, key=lambda r: quotas[r] - seats_of[r], reverse=True)
    for region in by_remainder[:left]:
        seats_of[region] += 1
    return seats_of


def _round_robin(eligible: dict[Region, int], per_region: int, seats: int) -> dict[Region, int]:
    reserved = dict.fromkeys(eligible, 0)
    for _ in range(per_region):
        for region, count in eligible.items():
            if seats > 0 and reserved[region] < count:
                reserved[region] += 1
                seats -= 1
    return reserved


def _entitlements(
    regions: dict[Region, int], settings: PlannerSettings, size: int
) -> dict[Region, int]:
    """What fairness promises each region, before looking at eligibility."""
    if settings.fairness == "proportional":
        return _largest_remainder(regions, size)
    if settings.fairness == "min_per_region":
        return {region: min(settings.min_per_region, count) for region, count in regions.items()}
    return {}


def _region_order(ranking: Sequence[Candidate], candidates: Sequence[Candidate]) -> list[Region]:
    """Regions by their best-ranked client (a random order), then the rest as given."""
    seen = dict.fromkeys(c.region for c in ranking)
    seen.update(dict.fromkeys(c.region for c in candidates))
    return list(seen)


def _reservations(
    entitled: dict[Region, int], ranking: Sequence[Candidate], settings: PlannerSettings, size: int
) -> dict[Region, int]:
    eligible = Counter(c.region for c in ranking)
    capped = {region: min(seats, eligible[region]) for region, seats in entitled.items()}
    if settings.fairness == "min_per_region":
        return _round_robin(capped, settings.min_per_region, size)
    return capped


def _fill(ranking: Sequence[Candidate], reserved: dict[Region, int], size: int) -> list[Candidate]:
    """Reservations first, from the top of the ranking; then the rest in ranking order."""
    taken: set[int] = set()
    per_region: Counter[Region] = Counter()
    for candidate in ranking:
        if per_region[candidate.region] < reserved.get(candidate.region, 0):
            taken.add(candidate.node_id)
            per_region[candidate.region] += 1
    for candidate in ranking:
        if len(taken) >= size:
            break
        taken.add(candidate.node_id)
    return [candidate for candidate in ranking if candidate.node_id in taken]


def _fallback_text(
    chosen: Sequence[Candidate], eligible: int, size: int, settings: PlannerSettings
) -> str | None:
    if not chosen:
        return None
    times = [c.predicted_s or 0.0 for c in chosen]
    window = (
        f"within the deadline of {settings.deadline_s:g} s "
        f"(x{settings.margin:g} safety margin = {settings.cutoff_s:g} s)"
    )
    spread = f"(predicted {min(times):.3g}-{max(times):.3g} s)"
    if eligible == 0:
        return (
            f"no client is predicted to finish {window}; chose the {len(chosen)} fastest {spread}"
        )
    return (
        f"only {eligible} of the {size} clients needed are predicted to finish {window} "
        f"or unmeasured; added the {len(chosen)} fastest of the rest {spread}"
    )


def _starved(
    entitled: dict[Region, int],
    selected: Iterable[Candidate],
    ranking: Sequence[Candidate],
    settings: PlannerSettings,
) -> tuple[tuple[Region, ...], tuple[str, ...]]:
    """Regions that got fewer clients than fairness promised, and why."""
    got = Counter(c.region for c in selected)
    eligible = Counter(c.region for c in ranking)
    regions, notes = [], []
    for region, seats in entitled.items():
        if got[region] >= seats:
            continue
        regions.append(region)
        why = (
            f"only {eligible[region]} of its clients are predicted to finish within "
            f"{settings.cutoff_s:g} s or unmeasured"
            if eligible[region] < seats
            else "the cohort is too small to reserve clients for every region"
        )
        notes.append(
            f"region {region!r} got {got[region]} of the {seats} clients that fairness "
            f"({settings.fairness}) reserves it: {why}"
        )
    return tuple(regions), tuple(notes)


def plan_cohort(
    candidates: Sequence[Candidate],
    settings: PlannerSettings,
    rng: random.Random,
    round_number: int,
) -> Plan:
    """Choose the round's cohort (the model is in the module docstring).

    Parameters
    ----------
    candidates
        The available clients; their order matters only for determinism.
    settings
        Cohort size, deadline, fairness, utility and exploration.
    rng
        The only source of randomness; the same state gives the same plan.
    round_number
        The round being planned (>= 1), for Oort's temporal-uncertainty bonus.

    Raises
    ------
    ValueError
        On duplicate node ids, a non-positive round number or a client whose last
        round is after it.
    """
    _check_candidates(candidates, round_number)
    size = min(settings.cohort_size, len(candidates))
    pools = _partition(candidates, settings)
    ranking = _ranking(pools, settings, rng, round_number)
    regions = {region: 0 for region in _region_order(ranking, candidates)}
    regions.update(Counter(c.region for c in candidates))
    entitled = _entitlements(regions, settings, size)
    chosen = _fill(ranking, _reservations(entitled, ranking, settings, size), size)
    fastest_late = sorted(pools.late, key=lambda c: c.predicted_s or 0.0)[: size - len(chosen)]
    starved, notes = _starved(entitled, [*chosen, *fastest_late], ranking, settings)
    unexplored = {c.node_id for c in pools.unexplored}
    selected = [
        PlannedClient(
            c.node_id, c.region, c.predicted_s, "explore" if c.node_id in unexplored else "fits"
        )
        for c in chosen
    ]
    selected += [
        PlannedClient(c.node_id, c.region, c.predicted_s, "fallback-fastest") for c in fastest_late
    ]
    return Plan(
        selected=tuple(selected),
        fallback=_fallback_text(fastest_late, len(ranking), size, settings),
        excluded_late=len(pools.late) - len(fastest_late),
        starved_regions=starved,
        notes=notes,
    )
