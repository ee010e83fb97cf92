"""The ``strategy`` section: how client updates become the next global model.

One model per strategy name, chosen by the ``name`` key (a discriminated union), so a
parameter that one strategy does not take is an unknown-key error rather than silently
ignored. Defaults follow the papers: FedOpt values from Reddi et al. (2021).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator

from geofl.server.config.fields import Section

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGY_CONFIGS",
    "FedAdagradConfig",
    "FedAdamConfig",
    "FedAvgConfig",
    "FedAvgMConfig",
    "FedProxConfig",
    "FedYogiConfig",
    "StrategyBase",
    "StrategyConfig",
]

#: The strategy used when the ``strategy`` section, or its ``name``, is left out.
DEFAULT_STRATEGY = "fedavg"
_COMMON_KEYS = frozenset({"name", "clients_per_round", "min_clients"})


def _server_lr(default: float) -> Any:
    return Field(
        default=default,
        gt=0,
        allow_inf_nan=False,
        description="Server learning rate: the step taken along the aggregated update.",
    )


def _name(tag: str) -> Any:
    return Field(default=tag, description="Aggregation strategy; selects which parameters apply.")


def _tau(default: float) -> Any:
    return Field(
        default=default,
        gt=0,
        allow_inf_nan=False,
        description="Adaptivity: added to the root of the second moment before dividing.",
    )


def _beta(default: float, what: str) -> Any:
    return Field(
        default=default, ge=0, lt=1, description=f"Decay rate of the {what} estimate, in [0, 1)."
    )


class StrategyBase(Section):
    """Keys every strategy takes: its name and the cohort size."""

    name: str = Field(description="Aggregation strategy; selects the parameters below.")
    clients_per_round: int = Field(
        default=2, ge=1, description="Target cohort size: clients selected for each fit round."
    )
    min_clients: int = Field(
        default=2,
        ge=1,
        validate_default=True,
        description=(
            "Results that must arrive for a round to commit; at most clients_per_round. "
            "Selection also waits until this many clients are connected."
        ),
    )

    @field_validator("min_clients")
    @classmethod
    def _within_cohort(cls, value: int, info: ValidationInfo) -> int:
        target = info.data.get("clients_per_round")
        if isinstance(target, int) and value > target:
            raise ValueError(f"min_clients ({value}) must not exceed clients_per_round ({target})")
        return value

    def params(self) -> dict[str, float]:
        """The strategy's own hyperparameters, by name (cohort keys and ``name`` left out)."""
        return {key: value for key, value in self.model_dump().items() if key not in _COMMON_KEYS}


class FedAvgConfig(StrategyBase):
    """FedAvg (McMahan et al., 2017): the example-weighted mean of client updates."""

    name: Literal["fedavg"] = _name("fedavg")
    server_lr: float = _server_lr(1.0)


class FedAvgMConfig(StrategyBase):
    """FedAvgM (Hsu et al., 2019): FedAvg with server momentum."""

    name: Literal["fedavgm"] = _name("fedavgm")
    server_lr: float = _server_lr(1.0)
    server_momentum: float = Field(
        default=0.9, ge=0, lt=1, description="Momentum of the server update, in [0, 1)."
    )


class FedProxConfig(StrategyBase):
    """FedProx (Li et al., 2020): FedAvg with a proximal term on each client's loss."""

    name: Literal["fedprox"] = _name("fedprox")
    server_lr: float = _server_lr(1.0)
    proximal_mu: float = Field(
        default=0.01,
        ge=0,
        allow_inf_nan=False,
        description="Weight of the proximal term; sent to clients with every fit task.",
    )


class FedAdamConfig(StrategyBase):
    """FedAdam (Reddi et al., 2021): Adam applied to the aggregate on the server."""

    name: Literal["fedadam"] = _name("fedadam")
    server_lr: float = _server_lr(0.01)
    beta_1: float = _beta(0.9, "first-moment")
    beta_2: float = _beta(0.99, "second-moment")
    tau: float = _tau(1e-3)


class FedYogiConfig(StrategyBase):
    """FedYogi (Reddi et al., 2021): Yogi's additive second-moment update on the server."""

    name: Literal["fedyogi"] = _name("fedyogi")
    server_lr: float = _server_lr(0.01)
    beta_1: float = _beta(0.9, "first-moment")
    beta_2: float = _beta(0.99, "second-moment")
    tau: float = _tau(1e-3)


class FedAdagradConfig(StrategyBase):
    """FedAdagrad (Reddi et al., 2021): Adagrad applied to the aggregate on the server."""

    name: Literal["fedadagrad"] = _name("fedadagrad")
    server_lr: float = _server_lr(0.1)
    tau: float = _tau(1e-3)


_MODELS: tuple[type[StrategyBase], ...] = (
    FedAvgConfig,
    FedAvgMConfig,
    FedProxConfig,
    FedAdamConfig,
    FedYogiConfig,
    FedAdagradConfig,
)
#: Strategy name -> its configuration model, in documentation order (read-only).
STRATEGY_CONFIGS: Mapping[str, type[StrategyBase]] = MappingProxyType(
    {str(model.model_fields["name"].default): model for model in _MODELS}
)


def _strategy_tag(value: object) -> str | None:
    """The union tag: ``name``, defaulting to fedavg; a non-string name matches no tag."""
    if isinstance(value, StrategyBase):
        return value.name
    if not isinstance(value, Mapping):
        return None
    name = value.get("name", DEFAULT_STRATEGY)
    return name if isinstance(name, str) else repr(name)


#: Any strategy's configuration, chosen by its ``name`` key.
StrategyConfig = Annotated[
    Union[  # noqa: UP007 -- Annotated members must be combined with typing.Union
        Annotated[FedAvgConfig, Tag("fedavg")],
        Annotated[FedAvgMConfig, Tag("fedavgm")],
        Annotated[FedProxConfig, Tag("fedprox")],
        Annotated[FedAdamConfig, Tag("fedadam")],
        Annotated[FedYogiConfig, Tag("fedyogi")],
        Annotated[FedAdagradConfig, Tag("fedadagrad")],
    ],
    Discriminator(_strategy_tag),
]
