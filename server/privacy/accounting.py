"""Privacy accounting by Google's ``dp-accounting`` library (RDP accountant), not by hand.

Each round of central DP releases the noised sum of clipped updates (a Gaussian mechanism
with noise multiplier ``z``: noise std ``z * clip_norm``) and, with adaptive clipping, the
noised count of unclipped updates (a second Gaussian, noise multiplier
``count_noise_multiplier``). One round is the :class:`~dp_accounting.ComposedDpEvent` of
the two; ``r`` rounds are that event self-composed ``r`` times.

Amplification by subsampling is applied only when the cohort really is a uniform sample
without replacement of ``clients_per_round`` out of a known ``population``
(:class:`Sampling`): then the round is a ``SampledWithoutReplacementDpEvent`` under the
replace-one relation, whose sensitivity for a sum of updates clipped to ``C`` is ``2C``,
so the update mechanism enters with noise multiplier ``z / 2``. Otherwise the round is
accounted as if every client of the population took part (add-or-remove-one relation,
sensitivity ``C``): no amplification.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from geofl.server.privacy.errors import PrivacyError

__all__ = [
    "INSTALL_HINT",
    "AccountedMechanism",
    "RoundMechanism",
    "Sampling",
    "calibrate_noise",
    "epsilon",
    "load_dp_accounting",
]

INSTALL_HINT = "pip install 'geofl[privacy]'"


def load_dp_accounting() -> ModuleType:
    """The ``dp_accounting`` module.

    Raises
    ------
    PrivacyError
        If it is not installed, naming the extra that installs it.
    """
    try:
        return importlib.import_module("dp_accounting")
    except ImportError as exc:
        raise PrivacyError(
            f"privacy needs Google's dp-accounting package ({exc}): {INSTALL_HINT}"
        ) from exc


class AccountedMechanism(Protocol):
    """One round of a DP mechanism as the accountant sees it: central
    (:class:`RoundMechanism`) or distributed
    (:class:`~geofl.server.privacy.distributed.DistributedMechanism`)."""

    @property
    def noise_multiplier(self) -> float:
        """``z``: the noise std on the sum divided by the clip norm."""

    def event(self, rounds: int) -> Any:
        """The ``dp_accounting`` event of ``rounds`` rounds."""

    def accountant(self) -> Any:
        """A fresh accountant under the mechanism's neighbouring relation."""


@dataclass(frozen=True)
class Sampling:
    """A uniform sample without replacement of ``cohort`` clients out of ``population``."""

    population: int
    cohort: int

    def __post_init__(self) -> None:
        if not 1 <= self.cohort <= self.population:
            raise PrivacyError(
                f"sampling {self.cohort} clients out of a population of {self.population} "
                "is not possible: need 1 <= clients_per_round <= population"
            )


@dataclass(frozen=True)
class RoundMechanism:
    """What one round of central DP releases, as the accountant sees it.

    Attributes
    ----------
    noise_multiplier
        ``z``: the noise std on the sum of clipped updates divided by the clip norm.
    count_noise_multiplier
        The noise std on the count of unclipped updates (adaptive clipping; sensitivity
        1), or None with a fixed clip norm.
    sampling
        The uniform sample that amplifies privacy, or None for no amplification.
    """

    noise_multiplier: float
    count_noise_multiplier: float | None = None
    sampling: Sampling | None = None

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0:
            raise PrivacyError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
        if self.count_noise_multiplier is not None and not self.count_noise_multiplier > 0:
            raise PrivacyError(
                f"count_noise_multiplier must be > 0, got {self.count_noise_multiplier}"
            )

    def event(self, rounds: int) -> Any:
        """The ``dp_accounting`` event of ``rounds`` rounds (a NoOp for 0)."""
        dp = load_dp_accounting()
        if rounds == 0:
            return dp.NoOpDpEvent()
        # Replace-one doubles the sum's sensitivity (see the module docstring).
        update_z = self.noise_multiplier / 2 if self.sampling else self.noise_multiplier
        parts = [dp.GaussianDpEvent(update_z)]
        if self.count_noise_multiplier is not None:
            parts.append(dp.GaussianDpEvent(self.count_noise_multiplier))
        one: Any = parts[0] if len(parts) == 1 else dp.ComposedDpEvent(parts)
        if self.sampling is not None:
            one = dp.SampledWithoutReplacementDpEvent(
                self.sampling.population, self.sampling.cohort, one
            )
        return dp.SelfComposedDpEvent(one, rounds)

    def accountant(self) -> Any:
        """A fresh RDP accountant under the neighbouring relation this sampling needs."""
        dp = load_dp_accounting()
        relation = (
            dp.NeighboringRelation.REPLACE_ONE
            if self.sampling
            else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
        )
        return dp.rdp.RdpAccountant(neighboring_relation=relation)


def epsilon(mechanism: AccountedMechanism, rounds: int, delta: float) -> float:
    """ε at ``delta`` after ``rounds`` rounds of ``mechanism`` (0 for no round)."""
    if rounds < 0:
        raise PrivacyError(f"rounds must be >= 0, got {rounds}")
    if not 0 < delta < 1:
        raise PrivacyError(f"delta must be in (0, 1), got {delta}")
    if rounds == 0:
        return 0.0
    accountant = mechanism.accountant()
    accountant.compose(mechanism.event(rounds))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)  # config validation and the coordinator ask the same
def calibrate_noise(
    target_epsilon: float,
    delta: float,
    rounds: int,
    count_noise_multiplier: float | None = None,
    sampling: Sampling | None = None,
) -> float:
    """The smallest noise multiplier whose ``rounds`` rounds spend at most
    ``target_epsilon`` at ``delta`` (dp_accounting's ``calibrate_dp_mechanism``).

    With adaptive clipping the count's noise is fixed and part of the budget: if it alone
    spends more than the target, no noise multiplier fits.
    """
    dp = load_dp_accounting()

    def mechanism(z: float) -> RoundMechanism:
        return RoundMechanism(max(z, 1e-6), count_noise_multiplier, sampling)

    try:
        z = dp.calibrate_dp_mechanism(
            lambda: mechanism(1.0).accountant(),
            lambda z: mechanism(z).event(rounds),
            target_epsilon,
            delta,
            bracket_interval=dp.LowerEndpointAndGuess(1e-3, 1.0),
        )
    except dp.mechanism_calibration.NoBracketIntervalFoundError as exc:
        raise PrivacyError(
            f"no noise multiplier keeps {rounds} rounds within ε={target_epsilon} at "
            f"δ={delta} (the count noise of adaptive clipping alone may spend more): {exc}"
        ) from exc
    return float(z)
