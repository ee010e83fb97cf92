"""Adaptive server optimizers (Reddi et al. 2021, "Adaptive Federated Optimization").

With ``delta = mean_delta`` (averaged client progress), every variant keeps
``m = beta_1 * m + (1 - beta_1) * delta`` and a second moment ``v``:

* FedAdagrad: ``v = v + delta**2``
* FedAdam:    ``v = beta_2 * v + (1 - beta_2) * delta**2``
* FedYogi:    ``v = v - (1 - beta_2) * delta**2 * sign(v - delta**2)``

and steps ``w = w + lr_t * m / (sqrt(v) + tau)``. ``m`` and ``v`` start at zero. To match
Flower 1.42 exactly, FedAdam's ``lr_t`` carries Flower's bias correction
``server_lr * sqrt(1 - beta_2**(r + 1)) / (1 - beta_1**(r + 1))`` for server round ``r``
(1-based; note the ``+ 1``, which is Flower's), and the others use ``lr_t = server_lr``.
Defaults are Flower's.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from geofl.protocols.types import Config
from geofl.server.strategies._numeric import F64Array
from geofl.server.strategies.server_opt import ServerOptStrategy, check_range

__all__ = ["FedAdagrad", "FedAdam", "FedOpt", "FedYogi"]

_INF = float("inf")


class FedOpt(ServerOptStrategy):
    """Shared first moment and step of the adaptive optimizers; subclasses define ``v``.

    Parameters
    ----------
    server_lr
        Server learning rate (Flower's ``eta``), > 0.
    beta_1
        First-moment decay in [0, 1).
    beta_2
        Second-moment decay in [0, 1) (unused by FedAdagrad).
    tau
        Adaptivity floor added to ``sqrt(v)``, > 0.
    """

    slots: ClassVar[tuple[str, ...]] = ("m", "v")

    def __init__(self, server_lr: float, beta_1: float, beta_2: float, tau: float) -> None:
        super().__init__()
        self.server_lr = check_range(
            "server_lr", server_lr, 0.0, _INF, low_open=True, high_open=True
        )
        self.beta_1 = check_range("beta_1", beta_1, 0.0, 1.0, low_open=False, high_open=True)
        self.beta_2 = check_range("beta_2", beta_2, 0.0, 1.0, low_open=False, high_open=True)
        self.tau = check_range("tau", tau, 0.0, _INF, low_open=True, high_open=True)

    def hyperparameters(self) -> Config:
        """Return the four hyperparameters by name."""
        return {
            "server_lr": self.server_lr,
            "beta_1": self.beta_1,
            "beta_2": self.beta_2,
            "tau": self.tau,
        }

    @abstractmethod
    def _second_moment(self, v: F64Array, delta: F64Array) -> F64Array:
        """Return the new second moment (a new array)."""

    def _learning_rate(self, server_round: int) -> float:
        """Return the step size for ``server_round``; plain ``server_lr`` by default."""
        return self.server_lr

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, dict[str, F64Array]]:
        """Update both moments and return the adaptive increment."""
        m = self.beta_1 * state["m"] + (1.0 - self.beta_1) * delta
        v = self._second_moment(state["v"], delta)
        increment = self._learning_rate(server_round) * m / (np.sqrt(v) + self.tau)
        return increment, {"m": m, "v": v}


class FedAdagrad(FedOpt):
    """FedAdagrad: ``v`` accumulates squared deltas; Flower's ``beta_1 = 0`` by default."""

    name: ClassVar[str] = "fedadagrad"

    def __init__(self, server_lr: float = 1e-1, beta_1: float = 0.0, tau: float = 1e-3) -> None:
        super().__init__(server_lr=server_lr, beta_1=beta_1, beta_2=0.0, tau=tau)

    def hyperparameters(self) -> Config:
        """Return ``server_lr``, ``beta_1`` and ``tau`` (``beta_2`` is unused)."""
        params = super().hyperparameters()
        del params["beta_2"]
        return params

    def _second_moment(self, v: F64Array, delta: F64Array) -> F64Array:
        """``v + delta**2``."""
        return v + delta**2


class FedAdam(FedOpt):
    """FedAdam: exponential moving second moment with Flower's bias correction."""

    name: ClassVar[str] = "fedadam"

    def __init__(
        self,
        server_lr: float = 1e-1,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-3,
    ) -> None:
        super().__init__(server_lr=server_lr, beta_1=beta_1, beta_2=beta_2, tau=tau)

    def _second_moment(self, v: F64Array, delta: F64Array) -> F64Array:
        """``beta_2 * v + (1 - beta_2) * delta**2``."""
        return self.beta_2 * v + (1.0 - self.beta_2) * delta**2

    def _learning_rate(self, server_round: int) -> float:
        """Bias-corrected step size, exponent ``server_round + 1`` as in Flower."""
        exponent = server_round + 1.0
        correction = np.sqrt(1.0 - np.power(self.beta_2, exponent)) / (
            1.0 - np.power(self.beta_1, exponent)
        )
        return float(self.server_lr * correction)


class FedYogi(FedOpt):
    """FedYogi: additive, sign-controlled second moment (Zaheer et al. 2018)."""

    name: ClassVar[str] = "fedyogi"

    def __init__(
        self,
        server_lr: float = 1e-2,
        beta_1: float = 0.9,
        beta_2: float = 0.99,
        tau: float = 1e-3,
    ) -> None:
        super().__init__(server_lr=server_lr, beta_1=beta_1, beta_2=beta_2, tau=tau)

    def _second_moment(self, v: F64Array, delta: F64Array) -> F64Array:
        """``v - (1 - beta_2) * delta**2 * sign(v - delta**2)``."""
        squared = delta**2
        return v - (1.0 - self.beta_2) * squared * np.sign(v - squared)
