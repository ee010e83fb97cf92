"""Distributed DP under secure aggregation: the mechanism's parameters and its accounting.

Each client clips its update to ``C``, rotates it, rounds it to the grid of step
``gamma`` with a norm bound ``D2`` (in steps) and adds discrete Gaussian noise of std
``s = z C / (gamma sqrt(n))`` steps, where ``n`` is ``min_survivors``, the fewest clients
whose noise any unmasked sum carries (a round with fewer survivors is aborted by the
server and refused by every client). The sum of ``n`` such shares is not a discrete
Gaussian, but Kairouz, Liu and Steinke (2021, Proposition 14) bound its Rényi divergence
at every order ``alpha`` by, among others, ``alpha/2 (D2 / (sqrt(n) s) + sqrt(d) tau)^2``
with ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 s^2 k / (k+1))`` and ``d`` the rotated
dimension. That is ``rho``-zCDP with ``rho = (D2 / (sqrt(n) s) + sqrt(d) tau)^2 / 2``; one
round is a ``dp_accounting.ZCDpEvent(rho)`` and the RDP accountant composes the rounds.

What the bound covers: the rounding's norm inflation (``D2 >= C / gamma``, the sensitivity
actually enforced by conditional rounding), the sum of discrete rather than continuous
noise (``tau``), and extra survivors beyond ``n`` (their noise is independent of the data:
post-processing). What it does not need to cover: wrap-around modulo ``2^ring_bits`` is a
function of the noised sum (post-processing), so it costs accuracy, never privacy;
geofl chooses ``gamma`` so that its probability per round is below :data:`WRAP_PROBABILITY`.
Subsampling amplification is not applied: dp-accounting amplifies Gaussian events, not a
zCDP bound, so a distributed run is accounted as if every client took part every round.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from geofl.protocols.ddp import DistributedDpError, padded_size, plan_granularity, rounding_bound
from geofl.server.privacy.accounting import load_dp_accounting
from geofl.server.privacy.errors import PrivacyError

__all__ = ["WRAP_PROBABILITY", "DistributedMechanism", "calibrate_distributed"]

#: The bound geofl keeps on the chance that a round's sum wraps around the ring.
WRAP_PROBABILITY = 1e-9


@dataclass(frozen=True)
class DistributedMechanism:
    """One round of the distributed discrete Gaussian mechanism, as planned and accounted.

    Attributes
    ----------
    noise_multiplier
        ``z``: the std of the noise summed over ``min_survivors`` clients is ``z C``.
    clip_norm
        ``C``.
    min_survivors
        ``n``: the fewest clients whose noise an unmasked sum carries.
    cohort
        The most clients whose updates are summed (``clients_per_round``): it sizes the
        ring's headroom.
    dimension
        Floats in the model.
    ring_bits
        The secure-aggregation ring.
    """

    noise_multiplier: float
    clip_norm: float
    min_survivors: int
    cohort: int
    dimension: int
    ring_bits: int

    def __post_init__(self) -> None:
        if not self.noise_multiplier > 0 or not self.clip_norm > 0:
            raise PrivacyError(
                f"need noise_multiplier > 0 and clip_norm > 0, got {self.noise_multiplier}, "
                f"{self.clip_norm}"
            )
        if not 1 <= self.min_survivors <= self.cohort:
            raise PrivacyError(
                f"min_survivors must be in 1..{self.cohort} (clients_per_round), got "
                f"{self.min_survivors}"
            )

    @property
    def padded_dimension(self) -> int:
        """The rotated vector's length."""
        return padded_size(self.dimension)

    @property
    def local_stddev(self) -> float:
        """Each client's noise std, in update units: ``z C / sqrt(n)``."""
        return self.noise_multiplier * self.clip_norm / math.sqrt(self.min_survivors)

    @functools.cached_property
    def granularity(self) -> float:
        """``gamma``: the finest step that keeps wrap-around below WRAP_PROBABILITY."""
        try:
            return plan_granularity(
                self.clip_norm,
                self.local_stddev,
                self.cohort,
                self.padded_dimension,
                self.ring_bits,
                WRAP_PROBABILITY,
            )
        except DistributedDpError as exc:
            raise PrivacyError(str(exc)) from exc

    @property
    def noise_stddev(self) -> float:
        """Each client's noise std, in integer steps."""
        return self.local_stddev / self.granularity

    @property
    def rounding_bound(self) -> float:
        """``D2``: the L2 norm of a rounded update, in steps, is at most this."""
        return rounding_bound(self.clip_norm / self.granularity, self.padded_dimension)

    @property
    def tau(self) -> float:
        """The paper's distance of the noise sum from one discrete Gaussian."""
        variance = self.noise_stddev**2
        return 10 * sum(
            math.exp(-2 * math.pi**2 * variance * k / (k + 1)) for k in range(1, self.min_survivors)
        )

    @property
    def rho(self) -> float:
        """The round's zCDP parameter (module docstring)."""
        scaled = self.rounding_bound / (math.sqrt(self.min_survivors) * self.noise_stddev)
        return 0.5 * (scaled + math.sqrt(self.padded_dimension) * self.tau) ** 2

    def check_ring(self) -> None:
        """Refuse a ring whose grid step is coarser than each client's noise.

        Raises
        ------
        PrivacyError
            Naming the step, the noise and what to change.
        """
        if self.noise_stddev < 1:
            raise PrivacyError(
                f"a {self.ring_bits}-bit ring is too small for this noise and clip norm: the "
                f"grid step {self.granularity:.3g} is larger than each client's noise std "
                f"{self.local_stddev:.3g} (the rounding would dominate the noise); raise "
                "secure_aggregation.ring_bits or lower clients_per_round"
            )

    def event(self, rounds: int) -> Any:
        """The ``dp_accounting`` event of ``rounds`` rounds."""
        dp = load_dp_accounting()
        if rounds == 0:
            return dp.NoOpDpEvent()
        return dp.SelfComposedDpEvent(dp.ZCDpEvent(self.rho), rounds)

    def accountant(self) -> Any:
        """An RDP accountant (add-or-remove-one: the sensitivity is one client's vector)."""
        dp = load_dp_accounting()
        return dp.rdp.RdpAccountant(neighboring_relation=dp.NeighboringRelation.ADD_OR_REMOVE_ONE)

    def with_noise(self, noise_multiplier: float) -> DistributedMechanism:
        """The same mechanism with another ``z``."""
        return DistributedMechanism(
            noise_multiplier,
            self.clip_norm,
            self.min_survivors,
            self.cohort,
            self.dimension,
            self.ring_bits,
        )


@functools.lru_cache(maxsize=64)
def calibrate_distributed(
    template: DistributedMechanism, target_epsilon: float, delta: float, rounds: int
) -> DistributedMechanism:
    """``template`` with the smallest ``z`` whose ``rounds`` rounds spend at most the target.

    Raises
    ------
    PrivacyError
        If no noise multiplier fits (for instance, the ring cannot hold enough noise).
    """
    dp = load_dp_accounting()

    def event(z: float) -> Any:
        return template.with_noise(max(z, 1e-6)).event(rounds)

    try:
        z = dp.calibrate_dp_mechanism(
            template.accountant,
            event,
            target_epsilon,
            delta,
            bracket_interval=dp.LowerEndpointAndGuess(1e-3, 1.0),
        )
    except (dp.mechanism_calibration.NoBracketIntervalFoundError, PrivacyError) as exc:
        raise PrivacyError(
            f"no noise multiplier keeps {rounds} rounds of distributed DP within "
            f"ε={target_epsilon} at δ={delta}: {exc}"
        ) from exc
    return template.with_noise(float(z))
