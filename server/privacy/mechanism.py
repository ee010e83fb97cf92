"""Central client-level DP: each update clipped, then Gaussian noise on the round's sum.

The server is trusted (it sees every clipped update); what is protected is the released
model: any one client's participation changes the sum of clipped updates by at most the
clip norm ``C``, and Gaussian noise of std ``z * C`` on that sum makes the round a
Gaussian mechanism with noise multiplier ``z`` (McMahan et al. 2018, DP-FedAvg). The sum
is divided by a fixed, public denominator (``clients_per_round``), not by the number of
updates that arrived: that count depends on who took part, so dividing by it would
release it un-noised. The noise std on the mean is therefore ``z * C / clients_per_round``.

Updates count once each (``num_examples`` is the client's claim and would scale its
sensitivity). Every tensor must be float: an integer counter would be averaged un-noised.

With adaptive clipping (Andrew et al. 2021) the share of unclipped updates that steers the
clip norm is released too, so it is noised: ``b = (unclipped + N(0, s^2)) / denominator``
with ``s`` the count noise multiplier (a count has sensitivity 1). Both mechanisms are
accounted (:mod:`geofl.server.privacy.accounting`).

The noise comes from a NumPy ``Generator`` seeded with 128 bits from the OS's
cryptographic source (:mod:`secrets`), fresh per run: never from the run's seed, which is
in its configuration.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.privacy.errors import PrivacyError
from geofl.server.strategies.errors import StrategyError
from geofl.server.strategies.robust import ClippedMean, QuantileClipNorm, RobustRule
from geofl.server.strategies.robust.rule import state_vector
from geofl.server.strategies.streaming import TensorSpecLike

__all__ = ["GaussianClip", "NoisedClippedMean", "check_float_model", "secure_generator"]


def check_float_model(spec: Mapping[str, TensorSpecLike]) -> None:
    """Refuse a model with non-float tensors: they would be averaged without noise.

    Raises
    ------
    PrivacyError
        Naming the tensors.
    """
    integers = [name for name, tensor in spec.items() if np.dtype(tensor.dtype).kind != "f"]
    if integers:
        raise PrivacyError(
            f"privacy needs every model tensor to be float; {integers} would be averaged "
            "without noise (keep counters out of the federated weights)"
        )


def secure_generator() -> np.random.Generator:
    """A NumPy generator seeded with 128 bits from the OS's cryptographic source."""
    return np.random.default_rng(secrets.randbits(128))


class NoisedClippedMean(ClippedMean):
    """Clipped updates summed; the sum noised and divided by a fixed denominator.

    Parameters
    ----------
    spec
        The model's tensors; every one must be float.
    clip_norm
        ``C``, the bound on each update's L2 norm.
    noise_multiplier
        ``z``: the noise std on the sum is ``z * C``.
    denominator
        The public number the noised sum is divided by (``clients_per_round``).
    rng
        Where the noise comes from.
    """

    def __init__(
        self,
        spec: Mapping[str, TensorSpecLike],
        clip_norm: float,
        noise_multiplier: float,
        denominator: int,
        rng: np.random.Generator,
    ) -> None:
        check_float_model(spec)
        super().__init__(spec, GaussianClip.name, clip_norm, weighted=False)
        self.noise_multiplier = noise_multiplier
        self.denominator = denominator
        self._rng = rng

    @property
    def noise_std(self) -> float:
        """The noise std on each coordinate of the returned mean: ``z * C / denominator``."""
        return self.noise_multiplier * self.clip_norm / self.denominator

    def mean(self) -> Weights:
        """``(sum of clipped updates + N(0, (z C)^2)) / denominator``, per coordinate."""
        plain = super().mean()  # the sum over the arrived updates, divided by their count
        scale = self.count / self.denominator
        noised: Weights = {}
        for name, tensor in plain.items():
            values = np.asarray(tensor, dtype=np.float64) * scale
            values += self._rng.normal(0.0, self.noise_std, size=values.shape)
            if not bool(np.isfinite(values).all()):
                raise StrategyError(f"noised mean of {name!r} is not finite")
            noised[name] = values.astype(np.asarray(tensor).dtype)
        return noised


class GaussianClip(RobustRule):
    """The central DP rule: clip (fixed or adaptive norm), sum, add Gaussian noise.

    Parameters
    ----------
    clip_norm
        ``C`` of the first round (of every round when ``target_quantile`` is None).
    noise_multiplier
        ``z``, > 0.
    denominator
        The fixed divisor of the noised sum (``clients_per_round``).
    target_quantile, learning_rate, count_noise_multiplier
        Adaptive clipping: all three set, or none (fixed clip norm).
    rng
        The noise source (default: :func:`secure_generator`); tests pass a seeded one.
    """

    name: ClassVar[str] = "dp_gaussian"
    STATE_KEY: ClassVar[str] = QuantileClipNorm.STATE_KEY

    def __init__(
        self,
        clip_norm: float,
        noise_multiplier: float,
        denominator: int,
        *,
        target_quantile: float | None = None,
        learning_rate: float | None = None,
        count_noise_multiplier: float | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        adaptive = (target_quantile, learning_rate, count_noise_multiplier)
        if any(v is None for v in adaptive) and any(v is not None for v in adaptive):
            raise PrivacyError(
                "adaptive clipping needs target_quantile, learning_rate and "
                "count_noise_multiplier together"
            )
        if not clip_norm > 0 or not noise_multiplier > 0 or denominator < 1:
            raise PrivacyError(
                f"need clip_norm > 0, noise_multiplier > 0, denominator >= 1; got "
                f"{clip_norm}, {noise_multiplier}, {denominator}"
            )
        self.initial_clip_norm = float(clip_norm)
        self.noise_multiplier = float(noise_multiplier)
        self.denominator = int(denominator)
        self.count_noise_multiplier = count_noise_multiplier
        self.rng = rng if rng is not None else secure_generator()
        #: The adaptive norm (None: the clip norm is fixed).
        self.norm = (
            None
            if target_quantile is None or learning_rate is None
            else QuantileClipNorm(clip_norm, target_quantile, learning_rate)
        )

    @property
    def adaptive(self) -> bool:
        """Whether the clip norm follows a quantile of the update norms."""
        return self.norm is not None

    @property
    def clip_norm(self) -> float:
        """The norm this round clips to."""
        return self.initial_clip_norm if self.norm is None else self.norm.clip_norm

    @property
    def target_quantile(self) -> float | None:
        """``gamma`` of adaptive clipping (None: fixed norm)."""
        return None if self.norm is None else self.norm.target_quantile

    @property
    def learning_rate(self) -> float | None:
        """``eta_C`` of adaptive clipping (None: fixed norm)."""
        return None if self.norm is None else self.norm.learning_rate

    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> NoisedClippedMean:
        """This round's noised clipped sum at the current clip norm."""
        if self.norm is not None:
            self.norm.begin_round()
        return _RoundMean(self, spec)

    def propose(self, unclipped: int) -> None:
        """The round's mean was taken: noise the unclipped count, propose the next norm.

        Only the noising is the DP part; the norm's step is :class:`QuantileClipNorm`'s,
        as for the non-private :class:`~geofl.server.strategies.robust.AdaptiveClip`.
        """
        if self.norm is None:
            return
        assert self.count_noise_multiplier is not None  # adaptive: all three are set
        noisy = unclipped + self.rng.normal(0.0, self.count_noise_multiplier)
        self.norm.propose(noisy / self.denominator)

    def commit(self, mean_delta: WeightsView) -> None:
        """The round was applied: move to the norm it proposed (adaptive only)."""
        if self.norm is not None:
            self.norm.commit()

    def min_updates(self) -> int:
        """One: each update is clipped on its own."""
        return 1

    def hyperparameters(self) -> Config:
        """The rule's settings (the current adaptive norm is state)."""
        params: Config = {
            "clip_norm": self.initial_clip_norm,
            "noise_multiplier": self.noise_multiplier,
            "denominator": self.denominator,
        }
        if self.norm is not None:
            assert self.count_noise_multiplier is not None
            params.update(
                target_quantile=self.norm.target_quantile,
                learning_rate=self.norm.learning_rate,
                count_noise_multiplier=self.count_noise_multiplier,
            )
        return params

    def state(self) -> Weights:
        """``{"clip_norm": [C]}`` with adaptive clipping, else nothing."""
        return {} if self.norm is None else self.norm.state()

    def load_state(self, state: WeightsView) -> None:
        """Resume at the saved adaptive clip norm (``{}``: the initial one).

        Raises
        ------
        StrategyError
            A saved norm for a fixed-norm rule, or one that is not one positive number.
        """
        if self.norm is None:
            if state_vector(state, self.STATE_KEY) is not None:
                raise StrategyError("saved clip norm for a rule without adaptive clipping")
            return
        self.norm.load_state(state)


class _RoundMean(NoisedClippedMean):
    """One round's accumulator, which reports its unclipped count back to its rule."""

    def __init__(self, rule: GaussianClip, spec: Mapping[str, TensorSpecLike]) -> None:
        super().__init__(spec, rule.clip_norm, rule.noise_multiplier, rule.denominator, rule.rng)
        self._owner = rule

    def mean(self) -> Weights:
        result = super().mean()
        self._owner.propose(self.unclipped)
        return result
