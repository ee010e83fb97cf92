"""The ``strategy`` section: how client updates become the next global model.

One model per strategy name, chosen by the ``name`` key (a discriminated union), so a
parameter that one strategy does not take is an unknown-key error rather than silently
ignored. Defaults follow the papers: FedOpt values from Reddi et al. (2021).

A ``flower`` key instead of ``name`` selects one of Flower 1.42's strategies
(:class:`FlowerStrategyConfig`); its ``args`` are checked by building the Flower strategy,
which imports Flower only then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from geofl.protocols.lr_schedule import check_schedule
from geofl.server.config.fields import ConfigScalar, Section
from geofl.server.config.robust import RobustConfig, breakdown_problem
from geofl.server.strategies.flower import (
    FLOWER_STRATEGIES,
    FLOWER_WRAPPERS,
    FlowerConfigError,
    check_flower_strategy,
)

__all__ = [
    "DEFAULT_STRATEGY",
    "FLOWER_KEY",
    "STRATEGY_CONFIGS",
    "AdamWConfig",
    "FedAdagradConfig",
    "FedAdamConfig",
    "FedAvgConfig",
    "FedAvgMConfig",
    "FedProxConfig",
    "FedYogiConfig",
    "FlowerStrategyConfig",
    "FlowerWrappedConfig",
    "StrategyBase",
    "StrategyConfig",
]

#: The strategy used when the ``strategy`` section, or its ``name``, is left out.
DEFAULT_STRATEGY = "fedavg"
#: The key selecting a Flower strategy, and the ``name`` such a strategy section carries.
FLOWER_KEY = "flower"
_COMMON_KEYS = frozenset(
    {"name", "clients_per_round", "min_clients", "max_examples_per_client", "robust"}
)


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
    max_examples_per_client: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Cap on the num_examples a client's update is weighted by (FedAvg weight, "
            "loss and metric averages); the reported figure is still recorded. null = "
            "no cap (a client's report is bounded only by the database column, 2^31-1)."
        ),
    )

    robust: RobustConfig | None = Field(
        default=None,
        description=(
            "A robust rule in place of the weighted mean, e.g. {name: median, byzantine: 1}; "
            "the server optimizer then steps from its aggregate (docs/robust.md). "
            "null = the plain weighted mean."
        ),
    )

    @model_validator(mode="after")
    def _within_breakdown(self) -> StrategyBase:
        """A round may commit with min_clients updates: the rule must hold for that many."""
        if self.robust is None:
            return self
        cohort = f"min_clients is {self.min_clients} (clients_per_round {self.clients_per_round})"
        problem = breakdown_problem(self.robust, self.min_clients, cohort)
        if problem is not None:
            raise ValueError(problem)
        return self

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


class AdamWConfig(StrategyBase):
    """AdamW on the server (PyTorch's formula) stepping the averaged gradient: synchronous
    data parallel, each client returning one plain gradient step (``w - g``); see
    ``geofl.server.strategies.adamw``."""

    name: Literal["adamw"] = _name("adamw")
    server_lr: float = _server_lr(1e-3)
    beta_1: float = _beta(0.9, "first-moment")
    beta_2: float = _beta(0.999, "second-moment")
    eps: float = Field(
        default=1e-8,
        gt=0,
        allow_inf_nan=False,
        description="Added to the bias-corrected root of the second moment before dividing.",
    )
    weight_decay: float = Field(
        default=0.01,
        ge=0,
        allow_inf_nan=False,
        description="Decoupled weight decay: weights shrink by server_lr x this each step.",
    )
    warmup_steps: int = Field(
        default=0, ge=0, description="Rounds of linear learning-rate warmup (0: none)."
    )
    decay_steps: int = Field(
        default=0,
        ge=0,
        description="Round at which the cosine decay reaches final_lr_ratio (0: no decay).",
    )
    final_lr_ratio: float = Field(
        default=0.1,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="The decayed learning rate as a share of server_lr.",
    )

    @model_validator(mode="after")
    def _schedule_is_valid(self) -> AdamWConfig:
        check_schedule(self.warmup_steps, self.decay_steps, self.final_lr_ratio)
        return self


#: Keyword arguments for a Flower strategy class: YAML scalars, or null.
FlowerArgs = dict[str, ConfigScalar | None]


def _flower_name(value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(
            f"{value!r} is not a supported Flower strategy; supported: {', '.join(allowed)}"
        )
    return value


class FlowerWrappedConfig(Section):
    """The Flower strategy a DifferentialPrivacy* wrapper adds noise (and clipping) to."""

    flower: str = Field(
        description="Class name in flwr.serverapp.strategy; any supported one but the "
        "DifferentialPrivacy* wrappers."
    )
    args: FlowerArgs = Field(
        default_factory=dict, description="Keyword arguments of the wrapped strategy."
    )

    @field_validator("flower")
    @classmethod
    def _plain_strategy(cls, value: str) -> str:
        plain = [name for name in FLOWER_STRATEGIES if name not in FLOWER_WRAPPERS]
        return _flower_name(value, plain)


class FlowerStrategyConfig(StrategyBase):
    """A Flower 1.42 strategy aggregating in geofl's rounds: `strategy: {flower: FedAdam,
    args: {eta: 0.01}}`. geofl's scheduler still picks the clients (clients_per_round,
    min_clients, evaluation.clients), so Flower's sampling arguments (fraction_train,
    fraction_evaluate, min_train_nodes, min_evaluate_nodes, min_available_nodes) are
    refused. Flower aggregates all of a round's updates at once: server memory is
    O(clients x model) for these strategies (the native ones stream in O(model)). The result
    is cast back to each tensor's dtype. FedAdam/FedYogi/FedAdagrad moments, FedAvgM momentum
    and adaptive clipping norms are checkpointed and resume. QFedAvg reads each client's
    `train_loss` metric; the DifferentialPrivacyClientSide* wrappers need clients that clip
    (e.g. a Flower ClientApp with fixedclipping_mod or adaptiveclipping_mod). Python-object
    arguments (accountant, selection_rule, metric aggregation functions) are not available.
    """

    name: Literal["flower"] = Field(
        default="flower",
        description="Implied by the flower key (leave it out): the strategy is Flower's.",
    )
    flower: str = Field(
        description=f"Class name in flwr.serverapp.strategy: {', '.join(FLOWER_STRATEGIES)}."
    )
    args: FlowerArgs = Field(
        default_factory=dict,
        description="Keyword arguments of the Flower class, e.g. {eta: 0.01}; checked "
        "against its signature and by building it.",
    )
    wraps: FlowerWrappedConfig | None = Field(
        default=None,
        description="For the DifferentialPrivacy* wrappers only: the strategy they wrap, "
        "{flower: FedAvg, args: {...}}.",
    )

    @model_validator(mode="before")
    @classmethod
    def _not_both_names(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and data.get("name", FLOWER_KEY) != FLOWER_KEY:
            raise ValueError(
                "name and flower are mutually exclusive: name picks a geofl strategy, "
                "flower one of Flower's"
            )
        return data

    @field_validator("robust")
    @classmethod
    def _no_robust_rule(cls, value: RobustConfig | None) -> RobustConfig | None:
        if value is not None:
            raise ValueError(
                "a robust rule cannot run in front of a Flower strategy (Flower aggregates "
                "the updates itself); use a geofl strategy (fedavg, fedavgm, fedprox, fedadam, "
                "fedyogi, fedadagrad) with strategy.robust, or Flower's own FedMedian, "
                "FedTrimmedAvg or Krum"
            )
        return value

    @field_validator("flower")
    @classmethod
    def _supported(cls, value: str) -> str:
        return _flower_name(value, FLOWER_STRATEGIES)

    @model_validator(mode="after")
    def _builds(self) -> FlowerStrategyConfig:
        """Build the Flower strategy once; a refusal names the key that caused it."""
        wraps = self.wraps.model_dump() if self.wraps is not None else None
        try:
            check_flower_strategy(self.flower, self.args, wraps)
        except FlowerConfigError as exc:
            error = PydanticCustomError("value_error", "{message}", {"message": exc.message})
            detail = InitErrorDetails(type=error, loc=exc.path, input=self.args)
            raise ValidationError.from_exception_data(type(self).__name__, [detail]) from exc
        return self


_MODELS: tuple[type[StrategyBase], ...] = (
    FedAvgConfig,
    FedAvgMConfig,
    FedProxConfig,
    FedAdamConfig,
    FedYogiConfig,
    FedAdagradConfig,
    AdamWConfig,
)
#: Strategy name -> its configuration model, in documentation order (read-only).
STRATEGY_CONFIGS: Mapping[str, type[StrategyBase]] = MappingProxyType(
    {str(model.model_fields["name"].default): model for model in _MODELS}
)


def _strategy_tag(value: object) -> str | None:
    """The union tag: ``flower`` when that key is there, else ``name`` (default fedavg); a
    non-string name matches no tag."""
    if isinstance(value, StrategyBase):
        return value.name
    if not isinstance(value, Mapping):
        return None
    if FLOWER_KEY in value:
        return FLOWER_KEY
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
        Annotated[AdamWConfig, Tag("adamw")],
        Annotated[FlowerStrategyConfig, Tag(FLOWER_KEY)],
    ],
    Discriminator(_strategy_tag),
]
