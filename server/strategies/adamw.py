"""AdamW on the server: synchronous data parallel with the optimizer at the coordinator.

For training one model across sites with every step's gradients averaged (synchronous
data parallel), each client returns ``w - g``, its weights after one plain gradient step
of unit size, so its delta is ``-g``; the server averages the deltas (example-weighted,
so equal examples give the plain mean of the gradients) and applies PyTorch's AdamW
(Loshchilov and Hutter, 2019) to the mean gradient ``g = -mean_delta``, step ``t`` being
the server round::

    m = beta_1 * m + (1 - beta_1) * g
    v = beta_2 * v + (1 - beta_2) * g**2
    w = w * (1 - lr * weight_decay) - lr * (m / (1 - beta_1**t)) / (sqrt(v / (1 - beta_2**t)) + eps)

``lr`` may follow a warmup and cosine decay by ``t`` (``warmup_steps``, ``decay_steps``,
``final_lr_ratio``: :mod:`geofl.protocols.lr_schedule`, the formula DiLoCo's sites use),
as ``torch.optim.lr_scheduler.LambdaLR`` stepped once per step would. The same formula as
``torch.optim.AdamW``, so a run equals one process training on the
combined batch (tested, in float64 here against float32 there). Unlike FedAdam's (Flower's
bias-correction exponent ``t + 1``, ``tau`` outside the correction), this is the optimizer
a site's own AdamW runs, which is what makes it the reference for DiLoCo's inner steps.

``t`` is the server round, not a count of steps taken: a failed round (no update) still
advances it, so after one the bias correction is that of a later step than torch's would
be. Runs whose rounds all commit (every site waited for, as data parallel needs) are exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from geofl.protocols.lr_schedule import check_schedule, scheduled_lr
from geofl.protocols.types import Config, Weights, WeightsView
from geofl.server.strategies._numeric import F64Array, is_integer, to_dtype
from geofl.server.strategies.server_opt import ServerOptStrategy, check_range

__all__ = ["AdamW"]

_INF = float("inf")


class AdamW(ServerOptStrategy):
    """PyTorch's AdamW stepping the negated mean delta (the averaged gradient).

    Parameters
    ----------
    server_lr
        Learning rate, > 0.
    beta_1, beta_2
        Moment decays in [0, 1).
    eps
        Added to the bias-corrected root of the second moment, > 0.
    weight_decay
        Decoupled weight decay, >= 0 (applied to every float tensor, as
        ``torch.optim.AdamW`` over all parameters does).
    warmup_steps, decay_steps, final_lr_ratio
        The learning rate's schedule by round (:mod:`geofl.protocols.lr_schedule`);
        the defaults keep ``server_lr`` constant.
    """

    name: ClassVar[str] = "adamw"
    slots: ClassVar[tuple[str, ...]] = ("m", "v")

    def __init__(
        self,
        server_lr: float = 1e-3,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        warmup_steps: int = 0,
        decay_steps: int = 0,
        final_lr_ratio: float = 0.1,
    ) -> None:
        super().__init__()
        self.server_lr = check_range(
            "server_lr", server_lr, 0.0, _INF, low_open=True, high_open=True
        )
        self.beta_1 = check_range("beta_1", beta_1, 0.0, 1.0, low_open=False, high_open=True)
        self.beta_2 = check_range("beta_2", beta_2, 0.0, 1.0, low_open=False, high_open=True)
        self.eps = check_range("eps", eps, 0.0, _INF, low_open=True, high_open=True)
        self.weight_decay = check_range(
            "weight_decay", weight_decay, 0.0, _INF, low_open=False, high_open=True
        )
        check_schedule(warmup_steps, decay_steps, final_lr_ratio)
        self.warmup_steps = warmup_steps
        self.decay_steps = decay_steps
        self.final_lr_ratio = final_lr_ratio

    def hyperparameters(self) -> Config:
        """Return the hyperparameters by name."""
        return {
            "server_lr": self.server_lr,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "eps": self.eps,
            "weight_decay": self.weight_decay,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "final_lr_ratio": self.final_lr_ratio,
        }

    def lr_at(self, server_round: int) -> float:
        """The learning rate of round ``server_round`` (``server_lr`` unless scheduled)."""
        return scheduled_lr(
            self.server_lr, server_round, self.warmup_steps, self.decay_steps, self.final_lr_ratio
        )

    def apply(
        self, global_weights: WeightsView, mean_delta: WeightsView, server_round: int
    ) -> Weights:
        """Decay the float weights (decoupled), then take the Adam step from the mean delta."""
        factor = 1.0 - self.lr_at(server_round) * self.weight_decay
        decayed: Weights = {
            name: weights
            if is_integer(weights.dtype) or factor == 1.0
            else to_dtype(np.asarray(weights, dtype=np.float64) * factor, weights.dtype, name)
            for name, weights in global_weights.items()
        }
        return super().apply(decayed, mean_delta, server_round)

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, dict[str, F64Array]]:
        """Adam's moments of ``g = -delta`` and the bias-corrected step (``t`` = round)."""
        gradient = -delta
        m = self.beta_1 * state["m"] + (1.0 - self.beta_1) * gradient
        v = self.beta_2 * state["v"] + (1.0 - self.beta_2) * gradient**2
        first = 1.0 - self.beta_1**server_round
        second = 1.0 - self.beta_2**server_round
        increment = -self.lr_at(server_round) * (m / first) / (np.sqrt(v / second) + self.eps)
        return increment, {"m": m, "v": v}
