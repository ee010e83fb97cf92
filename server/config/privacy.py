"""The ``privacy`` section: client-level differential privacy (docs/privacy.md).

``mechanism: central`` (the default without secure aggregation): each update is clipped
to ``clip_norm`` (fixed, or adaptive after Andrew et al. 2021), the clipped updates are
summed, Gaussian noise of std ``noise_multiplier x clip_norm`` is
added and the sum divided by ``strategy.clients_per_round``. Accounting is by Google's
``dp-accounting`` (RDP); ``noise_multiplier`` may instead be derived from
``target_epsilon`` for the planned rounds. Subsampling amplification applies only with
``sampling: uniform`` and a known ``population`` (checked against the selection policy by
:class:`~geofl.server.config.models.RunConfig`).

``mechanism: distributed`` (the default with ``secure_aggregation.enabled``): each client
clips, rounds and noises its own update in the ring before masking (the distributed
discrete Gaussian mechanism, :mod:`geofl.server.privacy.distributed`). Its exact ε depends
on the model's size, so the run configuration checks the continuous Gaussian's ε (a lower
bound) and the coordinator the exact one, both before the first round.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from geofl.server.config.fields import Section
from geofl.server.privacy import (
    AccountedMechanism,
    DistributedMechanism,
    GaussianClip,
    RoundMechanism,
    Sampling,
    calibrate_distributed,
    calibrate_noise,
    epsilon,
)

__all__ = [
    "AdaptiveClippingConfig",
    "PrivacyConfig",
    "budget_problem",
    "distributed_problem",
    "rounds_within",
]


class AdaptiveClippingConfig(Section):
    """The clip norm tracks a quantile of the update norms; the unclipped count is noised."""

    target_quantile: float = Field(
        default=0.5, gt=0, lt=1, description="Share of updates meant to be under the clip norm."
    )
    learning_rate: float = Field(
        default=0.2, gt=0, allow_inf_nan=False, description="Step of the geometric update."
    )
    count_noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Noise std on the count of unclipped updates (a count has sensitivity "
        "1); null = clients_per_round / 20, as Andrew et al. suggest. Accounted.",
    )


class PrivacyConfig(Section):
    """Client-level DP: central (the server noises the aggregate) or distributed (clients
    noise their updates in the secure-aggregation ring)."""

    mechanism: Literal["auto", "central", "distributed"] = Field(
        default="auto",
        description="'central': the server clips and noises (needs secure_aggregation off). "
        "'distributed': each client clips and adds discrete Gaussian noise in the ring "
        "before masking (needs secure_aggregation.enabled). 'auto': distributed with "
        "secure aggregation, else central.",
    )
    min_survivors: int | None = Field(
        default=None,
        ge=2,
        description="Distributed only: the fewest clients whose noise an unmasked sum "
        "carries. Each client adds 1/min_survivors of the noise variance; a round with fewer "
        "survivors is aborted (and every client refuses to unmask it). null = "
        "clients_per_round (no dropout tolerated).",
    )
    clip_norm: float = Field(
        gt=0,
        allow_inf_nan=False,
        description="Bound on each update's L2 norm (the first round's, with adaptive).",
    )
    adaptive: AdaptiveClippingConfig | None = Field(
        default=None, description="Adaptive clipping (Andrew et al. 2021); null = fixed norm."
    )
    noise_multiplier: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="z: noise std on the sum of clipped updates / clip_norm; null = the "
        "smallest z that keeps the planned rounds within target_epsilon.",
    )
    target_epsilon: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Privacy budget at delta: a run that would exceed it is refused (or, "
        "with on_budget: stop, stopped before the round that would exceed it).",
    )
    delta: float = Field(default=1e-5, gt=0, lt=1, description="The δ at which ε is reported.")
    sampling: Literal["none", "uniform"] = Field(
        default="none",
        description="'uniform': the cohort is a uniform sample without replacement of "
        "clients_per_round out of population, and ε is amplified by it (needs the uniform "
        "selection policy, no fairness, utility or node filter, over_select 1). 'none': no "
        "amplification, as if every client took part every round.",
    )
    population: int | None = Field(
        default=None, ge=1, description="sampling: uniform — the number of clients sampled from."
    )
    on_budget: Literal["refuse", "stop"] = Field(
        default="refuse",
        description="When the planned rounds would exceed target_epsilon: 'refuse' to start "
        "the run, or 'stop' it cleanly before the first round that would exceed it.",
    )

    @model_validator(mode="after")
    def _complete(self) -> PrivacyConfig:
        if self.noise_multiplier is None and self.target_epsilon is None:
            raise ValueError("privacy needs noise_multiplier, target_epsilon or both")
        if self.sampling == "uniform" and self.population is None:
            raise ValueError("privacy.sampling uniform needs privacy.population")
        if self.sampling == "none" and self.population is not None:
            raise ValueError(
                "privacy.population is only used with sampling: uniform (amplification)"
            )
        return self

    def is_distributed(self, secure_aggregation: bool) -> bool:
        """Whether the clients noise in the ring (see ``mechanism``)."""
        if self.mechanism == "auto":
            return secure_aggregation
        return self.mechanism == "distributed"

    def survivors(self, cohort: int) -> int:
        """``min_survivors``, defaulting to the whole cohort."""
        return self.min_survivors if self.min_survivors is not None else cohort

    def distributed_mechanism(
        self, cohort: int, rounds: int, dimension: int, ring_bits: int
    ) -> DistributedMechanism:
        """The distributed round for a model of ``dimension`` floats (calibrated if
        ``noise_multiplier`` is unset), its ring checked.

        Raises
        ------
        PrivacyError
            If the ring is too small or no noise fits the target.
        """
        template = DistributedMechanism(
            self.noise_multiplier or 1.0,
            self.clip_norm,
            self.survivors(cohort),
            cohort,
            dimension,
            ring_bits,
        )
        if self.noise_multiplier is None:
            assert self.target_epsilon is not None  # checked above
            template = calibrate_distributed(template, self.target_epsilon, self.delta, rounds)
        template.check_ring()
        return template

    def sample(self, cohort: int) -> Sampling | None:
        """The sample that amplifies ε, or None."""
        if self.sampling == "none":
            return None
        assert self.population is not None  # checked above
        return Sampling(self.population, cohort)

    def count_noise(self, cohort: int) -> float | None:
        """The adaptive count's noise std, or None with a fixed clip norm."""
        if self.adaptive is None:
            return None
        return self.adaptive.count_noise_multiplier or cohort / 20

    def central_mechanism(self, cohort: int, rounds: int) -> RoundMechanism:
        """One round as the accountant sees it (noise calibrated for ``rounds`` if unset)."""
        count, sampling = self.count_noise(cohort), self.sample(cohort)
        z = self.noise_multiplier
        if z is None:
            assert self.target_epsilon is not None  # checked above
            z = calibrate_noise(self.target_epsilon, self.delta, rounds, count, sampling)
        return RoundMechanism(z, count, sampling)

    def build(self, cohort: int, rounds: int) -> GaussianClip:
        """The DP rule for a run of ``rounds`` rounds of ``cohort`` clients."""
        mechanism = self.central_mechanism(cohort, rounds)
        adaptive = self.adaptive
        return GaussianClip(
            self.clip_norm,
            mechanism.noise_multiplier,
            cohort,
            target_quantile=adaptive.target_quantile if adaptive else None,
            learning_rate=adaptive.learning_rate if adaptive else None,
            count_noise_multiplier=mechanism.count_noise_multiplier,
        )


def rounds_within(mechanism: AccountedMechanism, target: float, delta: float, most: int) -> int:
    """How many rounds (at most ``most``) spend no more than ``target`` (bisection)."""
    low, high = 0, most  # epsilon(low) <= target; find the largest such
    while low < high:
        middle = (low + high + 1) // 2
        if epsilon(mechanism, middle, delta) <= target:
            low = middle
        else:
            high = middle - 1
    return low


def budget_problem(
    privacy: PrivacyConfig,
    cohort: int,
    rounds: int,
    mechanism: AccountedMechanism | None = None,
) -> str | None:
    """Why the run cannot start within ``privacy.target_epsilon``, or None.

    ``mechanism``: the round as accounted (default: the central one, which for a
    distributed run is a lower bound on its ε).
    """
    target = privacy.target_epsilon
    if target is None:
        return None
    if mechanism is None:
        mechanism = privacy.central_mechanism(cohort, rounds)
    first = epsilon(mechanism, 1, privacy.delta)
    if first > target:
        return (
            f"privacy.target_epsilon {target} is exceeded at round 1 already: one round "
            f"with noise_multiplier {mechanism.noise_multiplier:.4g} spends ε={first:.4g} at "
            f"δ={privacy.delta}; raise noise_multiplier or the target"
        )
    planned = epsilon(mechanism, rounds, privacy.delta)
    if planned <= target * (1 + 1e-9) or privacy.on_budget == "stop":
        return None
    fit = rounds_within(mechanism, target, privacy.delta, rounds)
    return (
        f"the planned {rounds} rounds spend ε={planned:.4g} at δ={privacy.delta}, over "
        f"privacy.target_epsilon {target}; only {fit} rounds fit: lower run.rounds, raise "
        "noise_multiplier, or set privacy.on_budget: stop"
    )


def distributed_problem(privacy: PrivacyConfig, cohort: int, ring_bits: int) -> str | None:
    """Why distributed DP cannot run with these settings (before the model is known), or
    None."""
    survivors = privacy.survivors(cohort)
    if survivors > cohort:
        return (
            f"privacy.min_survivors {survivors} exceeds strategy.clients_per_round {cohort}: "
            "no round could unmask"
        )
    if (1 << (ring_bits - 1)) - 1 - cohort <= 0:
        return (
            f"a {ring_bits}-bit ring cannot hold the sum of {cohort} rounded updates for "
            "distributed DP: raise secure_aggregation.ring_bits"
        )
    if privacy.adaptive is not None:
        return (
            "privacy.adaptive (adaptive clipping) is not built for distributed DP: the "
            "unclipped count would need its own noise in the ring; use a fixed clip_norm"
        )
    if privacy.sampling != "none":
        return (
            "privacy.sampling uniform is refused with distributed DP: dp-accounting amplifies "
            "sampled Gaussian events, not the zCDP bound of a sum of discrete Gaussians, so "
            "ε is accounted without amplification (sampling: none)"
        )
    return None
