"""FedAvg and its first-order relatives: FedProx and FedAvgM.

Sign convention throughout: ``mean_delta`` is the averaged client progress
(``client - global``), i.e. minus Flower's pseudo-gradient ``g = global - aggregate``. A
server step therefore *adds* ``server_lr * direction``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from geofl.protocols.types import Config, Scalar
from geofl.server.strategies._numeric import F64Array
from geofl.server.strategies.server_opt import ServerOptStrategy, check_range

__all__ = ["FedAvg", "FedAvgM", "FedProx"]


class FedAvg(ServerOptStrategy):
    """Federated averaging (McMahan et al. 2017): ``w + server_lr * mean_delta``.

    Parameters
    ----------
    server_lr
        Server learning rate; 1.0 makes the new model the clients' weighted average.
    """

    name: ClassVar[str] = "fedavg"

    def __init__(self, server_lr: float = 1.0) -> None:
        super().__init__()
        self.server_lr = check_range(
            "server_lr", server_lr, 0.0, float("inf"), low_open=True, high_open=True
        )

    def hyperparameters(self) -> Config:
        """Return ``{"server_lr": ...}``."""
        return {"server_lr": self.server_lr}

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, dict[str, F64Array]]:
        """Scale the mean delta by the server learning rate; no state."""
        return self.server_lr * delta, {}


class FedProx(FedAvg):
    """FedProx (Li et al. 2020): FedAvg on the server, a proximal term on the clients.

    Clients add ``proximal_mu / 2 * ||w - w_global||^2`` to their loss; the server only
    sends ``proximal_mu`` in the training config under :attr:`MU_KEY`.

    Parameters
    ----------
    proximal_mu
        Weight of the proximal term, >= 0 (0 reduces to FedAvg).
    server_lr
        Server learning rate, as in :class:`FedAvg`.
    """

    name: ClassVar[str] = "fedprox"
    #: Config key carrying ``proximal_mu`` (Flower's own FedProx uses ``"proximal-mu"``).
    MU_KEY: ClassVar[str] = "proximal_mu"

    def __init__(self, proximal_mu: float, server_lr: float = 1.0) -> None:
        super().__init__(server_lr=server_lr)
        self.proximal_mu = check_range(
            "proximal_mu", proximal_mu, 0.0, float("inf"), low_open=False, high_open=True
        )

    def hyperparameters(self) -> Config:
        """Return ``{"proximal_mu": ..., "server_lr": ...}``."""
        return {"proximal_mu": self.proximal_mu, **super().hyperparameters()}

    def configure_fit(self, server_round: int, base_config: Mapping[str, Scalar]) -> Config:
        """Return a copy of ``base_config`` with ``proximal_mu`` added."""
        config = super().configure_fit(server_round, base_config)
        config[self.MU_KEY] = self.proximal_mu
        return config


class FedAvgM(FedAvg):
    """FedAvg with server momentum (Hsu et al. 2019), heavy-ball form, no Nesterov.

    ``v = server_momentum * v + mean_delta``; ``w = w + server_lr * v``; ``v`` starts at 0.
    This equals Flower's ``FedAvgM`` (``nesterov=False``), whose momentum buffer holds the
    pseudo-gradient and so is ``-v``.

    Parameters
    ----------
    server_lr
        Server learning rate, > 0.
    server_momentum
        Momentum factor in [0, 1); 0 reduces to FedAvg.
    """

    name: ClassVar[str] = "fedavgm"
    slots: ClassVar[tuple[str, ...]] = ("momentum",)

    def __init__(self, server_lr: float = 1.0, server_momentum: float = 0.9) -> None:
        super().__init__(server_lr=server_lr)
        self.server_momentum = check_range(
            "server_momentum", server_momentum, 0.0, 1.0, low_open=False, high_open=True
        )

    def hyperparameters(self) -> Config:
        """Return ``{"server_lr": ..., "server_momentum": ...}``."""
        return {**super().hyperparameters(), "server_momentum": self.server_momentum}

    def _step(
        self, delta: F64Array, state: Mapping[str, F64Array], server_round: int
    ) -> tuple[F64Array, dict[str, F64Array]]:
        """Heavy-ball momentum on the mean delta."""
        velocity = self.server_momentum * state["momentum"] + delta
        return self.server_lr * velocity, {"momentum": velocity}
