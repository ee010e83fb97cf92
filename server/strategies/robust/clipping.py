"""Norm bounding: each update's float tensors scaled to at most a clip norm, then averaged.

Streaming, like FedAvg: the norm is measured when an update arrives and the update is
folded, scaled, into the running sum at once, so the server holds O(model) whatever the
cohort (the running float64 sums, as :class:`StreamingMean`).

Threat model: bounds how far any one client can move the aggregate, to
``clip_norm / n`` per round with unweighted averaging, whatever it sends. It does not
remove a bad update, so ``f`` colluding clients still move it by up to ``f * clip_norm / n``.
Integer tensors (counters) are not clipped.

:class:`AdaptiveClip` follows Andrew et al. (2021), "Differentially Private Learning with
Adaptive Clipping": after each round ``C <- C * exp(-eta * (b - gamma))``, where ``b`` is
the share of the round's updates whose norm was at most ``C``. Without differential
privacy ``b`` is used as measured; a DP mechanism would add noise to it
(:attr:`ClippedMean.unclipped`, per round, is what it would noise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

import numpy as np

from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.strategies.checks import UpdateCheck
from geofl.server.strategies.errors import StrategyError
from geofl.server.strategies.robust.kernels import next_clip_norm
from geofl.server.strategies.robust.rule import RobustRule, float_norm, state_vector
from geofl.server.strategies.server_opt import check_range
from geofl.server.strategies.streaming import StreamingMean, TensorSpecLike

__all__ = ["AdaptiveClip", "ClippedMean", "FixedClip", "QuantileClipNorm"]

_INF = float("inf")


class ClippedMean(StreamingMean):
    """A running mean of updates each scaled to norm at most ``clip_norm``.

    Parameters
    ----------
    spec
        The model's tensors (names, dtypes, shapes).
    rule
        The rule's name, for the per-client reasons.
    clip_norm
        The bound on each update's L2 norm (its float tensors together).
    weighted
        Weight each update by its (capped) ``num_examples``; False counts each once,
        because ``num_examples`` is the client's own claim.
    on_mean
        Called with the share of updates that were not clipped when the mean is taken.
    """

    def __init__(
        self,
        spec: Mapping[str, TensorSpecLike],
        rule: str,
        clip_norm: float,
        *,
        weighted: bool = False,
        on_mean: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(spec)
        self._rule = rule
        self.clip_norm = clip_norm
        self._weighted = weighted
        self._on_mean = on_mean
        self._floats = tuple(n for n, t in spec.items() if np.dtype(t.dtype).kind == "f")
        #: Updates whose norm was at most the clip norm (used as sent).
        self.unclipped = 0

    def add(self, update: WeightsView, weight: float) -> UpdateCheck:
        """Validate, measure and fold one update, scaled down if its norm is over the bound.

        Raises
        ------
        UpdateRejected
            As :meth:`StreamingMean.add`; nothing is folded then.
        """
        factor = self.validate(update, weight)
        norm = float_norm(update, self._floats)
        check = UpdateCheck(self._rule, norm=norm)
        scale = 1.0 if norm <= self.clip_norm else self.clip_norm / norm
        if scale < 1.0:
            check.shrink(
                scale,
                f"{self._rule}: norm {norm:.4g} over the clip norm {self.clip_norm:.4g}, "
                f"scaled by {scale:.3g}",
            )
        self.fold(update, factor if self._weighted else 1.0, scale)
        if scale == 1.0:
            with self._lock:
                self.unclipped += 1
        return check

    def mean(self) -> Weights:
        """The mean of the clipped updates; tells ``on_mean`` the unclipped share."""
        result = super().mean()
        if self._on_mean is not None:
            self._on_mean(self.unclipped / self.count)
        return result


class FixedClip(RobustRule):
    """Clip every update to the same norm, every round.

    Parameters
    ----------
    clip_norm
        The bound on each update's L2 norm, > 0.
    weighted
        Weight updates by ``num_examples`` (default: each counts once).
    """

    name: ClassVar[str] = "clip"

    def __init__(self, clip_norm: float, weighted: bool = False) -> None:
        self.clip_norm = check_range(
            "clip_norm", clip_norm, 0.0, _INF, low_open=True, high_open=True
        )
        self.weighted = bool(weighted)

    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> ClippedMean:
        """A clipped running mean at the fixed norm."""
        return ClippedMean(spec, self.name, self.clip_norm, weighted=self.weighted)

    def min_updates(self) -> int:
        """One: clipping bounds each update on its own."""
        return 1

    def hyperparameters(self) -> Config:
        """``clip_norm`` and ``weighted``."""
        return {"clip_norm": self.clip_norm, "weighted": self.weighted}


class QuantileClipNorm:
    """A clip norm that tracks a quantile of the update norms (Andrew et al. 2021).

    The one implementation of the adaptive norm's life cycle, shared by
    :class:`AdaptiveClip` (measured share) and the central DP rule
    (:class:`geofl.server.privacy.GaussianClip`, noised share): a round's mean
    proposes (:meth:`propose`) the next norm from the share of its updates that were not
    clipped, :meth:`commit` moves to it once the round is applied, and a round that
    is never applied leaves the norm where it was (:meth:`begin_round` drops a
    stale proposal). :meth:`state` / :meth:`load_state` checkpoint it.

    Parameters
    ----------
    initial_clip_norm
        The norm of the first round, > 0.
    target_quantile
        ``gamma``: the share of updates meant to be under the bound, in (0, 1).
    learning_rate
        ``eta_C``: the geometric step size, > 0.
    """

    STATE_KEY: ClassVar[str] = "clip_norm"

    def __init__(
        self, initial_clip_norm: float, target_quantile: float, learning_rate: float
    ) -> None:
        self.initial_clip_norm = check_range(
            "initial_clip_norm", initial_clip_norm, 0.0, _INF, low_open=True, high_open=True
        )
        self.target_quantile = check_range(
            "target_quantile", target_quantile, 0.0, 1.0, low_open=True, high_open=True
        )
        self.learning_rate = check_range(
            "learning_rate", learning_rate, 0.0, _INF, low_open=True, high_open=True
        )
        #: The norm this round clips to.
        self.clip_norm = self.initial_clip_norm
        self._pending: float | None = None

    def begin_round(self) -> None:
        """A new round starts: forget a proposal whose round was never applied."""
        self._pending = None

    def propose(self, unclipped_share: float) -> None:
        """The round's mean was taken with ``unclipped_share`` of its updates unclipped."""
        share = min(1.0, max(0.0, float(unclipped_share)))
        self._pending = next_clip_norm(
            self.clip_norm, share, self.target_quantile, self.learning_rate
        )

    def commit(self) -> None:
        """The round was applied: move to the norm it proposed."""
        if self._pending is not None:
            self.clip_norm, self._pending = self._pending, None

    def state(self) -> Weights:
        """``{"clip_norm": [C]}``: the norm the next round clips to."""
        return {self.STATE_KEY: np.array([self.clip_norm], dtype=np.float64)}

    def load_state(self, state: WeightsView) -> None:
        """Resume at the saved clip norm (``{}``: back to the initial one).

        Raises
        ------
        StrategyError
            If the saved value is not one positive number, or ``state`` has other keys.
        """
        vector = state_vector(state, self.STATE_KEY)
        if vector is None:
            self.clip_norm = self.initial_clip_norm
            return
        if vector.size != 1 or not vector[0] > 0:
            raise StrategyError(f"saved clip norm must be one positive number, got {vector}")
        self.clip_norm = float(vector[0])


class AdaptiveClip(RobustRule):
    """Clip to a norm that tracks a quantile of the update norms (Andrew et al. 2021).

    Parameters
    ----------
    initial_clip_norm
        The clip norm of the first round, > 0.
    target_quantile
        ``gamma``: the share of updates meant to be under the bound, in (0, 1).
    learning_rate
        ``eta_C``: the geometric step size, > 0 (the paper's 0.2 by default).
    weighted
        Weight updates by ``num_examples`` (default: each counts once).
    """

    name: ClassVar[str] = "adaptive_clip"
    STATE_KEY: ClassVar[str] = QuantileClipNorm.STATE_KEY

    def __init__(
        self,
        initial_clip_norm: float = 0.1,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        weighted: bool = False,
    ) -> None:
        self.norm = QuantileClipNorm(initial_clip_norm, target_quantile, learning_rate)
        self.weighted = bool(weighted)

    @property
    def clip_norm(self) -> float:
        """The norm this round clips to."""
        return self.norm.clip_norm

    @property
    def initial_clip_norm(self) -> float:
        """The first round's norm."""
        return self.norm.initial_clip_norm

    @property
    def target_quantile(self) -> float:
        """``gamma``."""
        return self.norm.target_quantile

    @property
    def learning_rate(self) -> float:
        """``eta_C``."""
        return self.norm.learning_rate

    def accumulator(self, spec: Mapping[str, TensorSpecLike]) -> ClippedMean:
        """A clipped running mean at this round's norm; its mean proposes the next norm."""
        self.norm.begin_round()
        return ClippedMean(
            spec, self.name, self.clip_norm, weighted=self.weighted, on_mean=self.norm.propose
        )

    def commit(self, mean_delta: WeightsView) -> None:
        """The round was applied: move to the norm its updates proposed."""
        self.norm.commit()

    def min_updates(self) -> int:
        """One: clipping bounds each update on its own."""
        return 1

    def hyperparameters(self) -> Config:
        """The four settings (the current norm is state, not a setting)."""
        return {
            "initial_clip_norm": self.initial_clip_norm,
            "target_quantile": self.target_quantile,
            "learning_rate": self.learning_rate,
            "weighted": self.weighted,
        }

    def state(self) -> Weights:
        """``{"clip_norm": [C]}``: the norm the next round clips to."""
        return self.norm.state()

    def load_state(self, state: WeightsView) -> None:
        """Resume at the saved clip norm (``{}``: back to the initial one)."""
        self.norm.load_state(state)
