"""The ``strategy.robust`` section: a robust rule in place of the plain weighted mean.

One model per rule, chosen by the section's ``name`` (a discriminated union, as the
strategy itself), so a setting one rule does not take is an unknown-key error. The
breakdown point is checked where the cohort is known (:class:`StrategyBase`); the rules
themselves, and docs/robust.md, say what each one defends against.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag

from geofl.server.config.fields import RelativePath, Section
from geofl.server.strategies import FedAvg, Strategy
from geofl.server.strategies.robust import RobustRule, RobustStrategy, make_rule

__all__ = [
    "ROBUST_CONFIGS",
    "AdaptiveClipConfig",
    "CenteredClipConfig",
    "ClipConfig",
    "KrumConfig",
    "MedianConfig",
    "MultiKrumConfig",
    "RobustBase",
    "RobustConfig",
    "TrimmedMeanConfig",
    "breakdown_problem",
    "regional_strategy",
]


def _name(tag: str) -> Any:
    return Field(default=tag, description="The robust rule; selects which settings apply.")


def _byzantine(what: str) -> Any:
    return Field(ge=0, description=f"f: malicious updates per round to tolerate; {what}.")


def _weighted() -> Any:
    return Field(
        default=False,
        description="Weight updates by their (capped) num_examples; false counts each once "
        "(num_examples is the client's own claim).",
    )


_SPILL_DIR = Field(
    default=None,
    description="Directory for the round's memory-mapped update files (8 bytes x "
    "parameters x clients, removed after the round); null = the system's temp directory.",
)


class RobustBase(Section):
    """Keys every robust rule takes."""

    name: str = Field(description="The robust rule.")

    def build(self) -> RobustRule:
        """The rule these settings describe."""
        params = self.model_dump()
        return make_rule(params.pop("name"), **params)


class ClipConfig(RobustBase):
    """Norm bounding: each update scaled to at most clip_norm, then averaged. Streaming,
    O(model) memory. Bounds one client's pull to clip_norm / n per round."""

    name: Literal["clip"] = _name("clip")
    clip_norm: float = Field(
        gt=0, allow_inf_nan=False, description="Bound on each update's L2 norm."
    )
    weighted: bool = _weighted()


class AdaptiveClipConfig(RobustBase):
    """Norm bounding at a norm that tracks a quantile of the update norms (Andrew et al.
    2021): C <- C exp(-learning_rate (b - target_quantile)), b the share of the round's
    updates under C. Streaming, O(model) memory; the norm is checkpointed."""

    name: Literal["adaptive_clip"] = _name("adaptive_clip")
    initial_clip_norm: float = Field(
        default=0.1, gt=0, allow_inf_nan=False, description="The clip norm of the first round."
    )
    target_quantile: float = Field(
        default=0.5, gt=0, lt=1, description="Share of updates meant to be under the norm."
    )
    learning_rate: float = Field(
        default=0.2, gt=0, allow_inf_nan=False, description="Step size of the geometric update."
    )
    weighted: bool = _weighted()


class MedianConfig(RobustBase):
    """Coordinate-wise median (Yin et al. 2018); needs 2 byzantine < min_clients. Updates
    spilled to memory-mapped files."""

    name: Literal["median"] = _name("median")
    byzantine: int = _byzantine("the median tolerates fewer than half")
    spill_dir: RelativePath | None = _SPILL_DIR


class TrimmedMeanConfig(RobustBase):
    """Coordinate-wise trimmed mean: the byzantine largest and smallest values of each
    coordinate dropped (Yin et al. 2018); needs 2 byzantine < min_clients. Spilled."""

    name: Literal["trimmed_mean"] = _name("trimmed_mean")
    byzantine: int = _byzantine("also how many values are trimmed from each end")
    spill_dir: RelativePath | None = _SPILL_DIR


class KrumConfig(RobustBase):
    """Krum (Blanchard et al. 2017): the update closest to its n - f - 2 nearest others is
    the aggregate; the rest are left out. Needs min_clients > 2 byzantine + 2. Spilled."""

    name: Literal["krum"] = _name("krum")
    byzantine: int = _byzantine("Krum needs n > 2f + 2")
    spill_dir: RelativePath | None = _SPILL_DIR


class MultiKrumConfig(RobustBase):
    """Multi-Krum: the mean of the select updates with the lowest Krum scores. Needs
    min_clients > 2 byzantine + 2 and select <= min_clients - byzantine. Spilled."""

    name: Literal["multi_krum"] = _name("multi_krum")
    byzantine: int = _byzantine("Krum needs n > 2f + 2")
    select: int | None = Field(
        default=None, ge=1, description="Updates averaged; null = n - byzantine of the round's n."
    )
    spill_dir: RelativePath | None = _SPILL_DIR


class CenteredClipConfig(RobustBase):
    """Centered clipping (Karimireddy et al. 2021): from the last round's aggregate, each
    update's offset clipped to radius, iterated; defends against small colluding
    perturbations. The centre is checkpointed. Spilled."""

    name: Literal["centered_clip"] = _name("centered_clip")
    radius: float = Field(
        gt=0, allow_inf_nan=False, description="tau: clipping radius around the centre."
    )
    iterations: int = Field(default=3, ge=1, description="L: clipping iterations per round.")
    byzantine: int = Field(
        default=0, ge=0, description="f: malicious updates to tolerate; checked as 2f < n."
    )
    spill_dir: RelativePath | None = _SPILL_DIR


_MODELS: tuple[type[RobustBase], ...] = (
    ClipConfig,
    AdaptiveClipConfig,
    MedianConfig,
    TrimmedMeanConfig,
    KrumConfig,
    MultiKrumConfig,
    CenteredClipConfig,
)
#: Rule name -> its configuration model (documentation order).
ROBUST_CONFIGS: Mapping[str, type[RobustBase]] = {
    str(model.model_fields["name"].default): model for model in _MODELS
}


def _rule_tag(value: object) -> str | None:
    if isinstance(value, RobustBase):
        return value.name
    if isinstance(value, Mapping):
        name = value.get("name")
        return name if isinstance(name, str) else repr(name)
    return None


#: Any robust rule's settings, chosen by ``name``.
RobustConfig = Annotated[
    Union[  # noqa: UP007 -- Annotated members must be combined with typing.Union
        Annotated[ClipConfig, Tag("clip")],
        Annotated[AdaptiveClipConfig, Tag("adaptive_clip")],
        Annotated[MedianConfig, Tag("median")],
        Annotated[TrimmedMeanConfig, Tag("trimmed_mean")],
        Annotated[KrumConfig, Tag("krum")],
        Annotated[MultiKrumConfig, Tag("multi_krum")],
        Annotated[CenteredClipConfig, Tag("centered_clip")],
    ],
    Discriminator(_rule_tag),
]


#: How each rule's breakdown point reads, for the error naming it.
_BREAKDOWN = {
    "clip": "at least one",
    "adaptive_clip": "at least one",
    "median": "the median tolerates f < n / 2",
    "trimmed_mean": "trimming f from each end needs 2f < n",
    "krum": "Krum needs n > 2f + 2",
    "multi_krum": "Krum needs n > 2f + 2, and select <= n - f",
    "centered_clip": "an honest majority, 2f < n",
}


def breakdown_problem(robust: RobustBase, min_clients: int, cohort: str) -> str | None:
    """Why ``robust`` cannot hold for rounds that commit with ``min_clients`` updates, or
    None when it can. ``cohort`` names the keys, e.g. ``"min_clients is 4"``."""
    rule = robust.build()
    needed = rule.min_updates()
    if min_clients >= needed:
        return None
    settings = ", ".join(f"{key} {value!r}" for key, value in rule.hyperparameters().items())
    return (
        f"robust rule {rule.name} with {settings} needs at least {needed} updates per round "
        f"({_BREAKDOWN[rule.name]}), but {cohort} and a round may commit with that many "
        "updates: raise it, or tolerate fewer attackers"
    )


def regional_strategy(robust: RobustBase | None) -> Strategy:
    """A relay's regional strategy: FedAvg, behind ``robust`` when one is configured.

    Built once per region, so a rule's memory (a centre, an adaptive norm) carries from one
    of the coordinator's tasks to the next (not across a relay restart).
    """
    if robust is None:
        return FedAvg()
    return RobustStrategy(FedAvg(), robust.build())
