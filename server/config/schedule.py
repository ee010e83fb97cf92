"""Sections of ``schedule`` beyond the synchronous round: selection, async, DiLoCo and its
variants (partial sync, Streaming DiLoCo)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from geofl.server.config.fields import Section

__all__ = [
    "AsyncConfig",
    "DilocoConfig",
    "PartialSyncConfig",
    "SelectionConfig",
    "StalenessConfig",
    "StreamingConfig",
]


class SelectionConfig(Section):
    """How a round's cohort is chosen among the available clients."""

    policy: Literal["uniform", "deadline"] = Field(
        default="uniform",
        description="'uniform': a seeded uniform sample (Flower's behaviour). 'deadline': "
        "clients predicted (from measured links and compute) to finish within "
        "schedule.deadline_s, unmeasured ones explored; if none can, the fastest, recorded "
        "as a fallback.",
    )
    margin: float = Field(
        default=0.9,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="policy: deadline — a client fits if its predicted time is at most "
        "margin x deadline_s.",
    )
    fairness: Literal["none", "proportional", "min_per_region"] = Field(
        default="none",
        description="Region balance: 'proportional' keeps each region's share of the "
        "cohort near its share of available clients; 'min_per_region' takes at least "
        "min_per_region from every region that has an eligible client.",
    )
    min_per_region: int = Field(
        default=1, ge=0, description="fairness: min_per_region — clients per region."
    )
    utility: bool = Field(
        default=False,
        description="Oort-style: sample eligible clients by statistical utility (last "
        "training loss x examples) times a speed penalty, instead of uniformly.",
    )
    exploration: float = Field(
        default=0.1,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="Share of the cohort given to clients never measured yet.",
    )
    node_config: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description="Only nodes whose node config has all of these values are given work "
        "(as a Flower Criterion would select them); the others stay connected and idle. "
        "{} = every node.",
    )


class StalenessConfig(Section):
    """How much an update computed on an old model counts (FedBuff)."""

    function: Literal["constant", "polynomial", "hinge"] = Field(
        default="polynomial",
        description="'constant': 1; 'polynomial': (1 + s)^-exponent; 'hinge': 1 up to "
        "hinge_at, then 1 / (1 + exponent (s - hinge_at)); s = versions behind.",
    )
    exponent: float = Field(
        default=0.5, ge=0, allow_inf_nan=False, description="Exponent (or hinge slope)."
    )
    hinge_at: int = Field(default=4, ge=0, description="'hinge': staleness with full weight.")
    max: int = Field(
        default=20,
        ge=1,
        description="Updates more than this many versions behind are discarded (recorded "
        "as late); must be at least 1.",
    )


class AsyncConfig(Section):
    """Buffered asynchronous aggregation (FedBuff, Nguyen et al., 2022)."""

    buffer_size: int = Field(
        default=10, ge=1, description="K: the server applies an update every K arrivals."
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Clients training at any time; null = strategy.clients_per_round.",
    )
    staleness: StalenessConfig = Field(
        default_factory=StalenessConfig, description="Discount of stale updates."
    )
    updates: int | None = Field(
        default=None,
        ge=1,
        description="Server updates (model versions) in the run; null = run.rounds. Each "
        "one is recorded as a round.",
    )


class DilocoConfig(Section):
    """DiLoCo (Douillard et al., 2023): H local steps, outer Nesterov momentum."""

    local_steps: int = Field(
        default=50,
        ge=1,
        description="H: inner optimizer steps per client per round (sent as round config "
        "local_steps).",
    )
    outer_lr: float = Field(
        default=0.7, gt=0, allow_inf_nan=False, description="Outer learning rate."
    )
    outer_momentum: float = Field(
        default=0.9, ge=0, lt=1, allow_inf_nan=False, description="Outer Nesterov momentum."
    )

    @model_validator(mode="after")
    def _sane(self) -> DilocoConfig:
        if self.outer_lr > 10:
            raise ValueError(f"outer_lr {self.outer_lr} is implausibly large (DiLoCo uses 0.7)")
        return self


class PartialSyncConfig(Section):
    """Layer-wise partial synchronization of DiLoCo rounds (DreamDDP-style).

    The H local steps are cut into ``sync_points`` segments; after segment k, layer group
    k is frozen into the upload and sent while the remaining segments train, so the WAN
    transfer hides behind computation and only the last group's transfer is exposed.
    """

    sync_points: int = Field(
        default=0,
        ge=0,
        description="Layer groups per round, each sent after its segment of local steps; "
        "0 = off (the whole model is sent after the last step). At most "
        "schedule.diloco.local_steps.",
    )
    groups: list[list[str]] | None = Field(
        default=None,
        description="Explicit groups in sync order, as lists of tensor-name patterns "
        "(fnmatch, e.g. 'conv1.*'); every tensor must match exactly one group. null = "
        "planned: groups of balanced bytes, the tensors that changed least in the last "
        "outer steps synchronized first.",
    )
    tail_steps: int | None = Field(
        default=None,
        ge=1,
        description="Local steps between consecutive sync points at the end of the round; "
        "the first segment takes the rest, so each group is sent as late as its transfer "
        "can still hide behind the steps after it. null = max(1, H // (2 x sync points)).",
    )
    keep_local: bool = Field(
        default=True,
        description="Keep what a layer learns after its group was sent on the client and "
        "add it to the client's next upload of that layer (otherwise it is discarded).",
    )

    @property
    def enabled(self) -> bool:
        """Whether rounds are partially synchronized."""
        return self.sync_points > 0 or self.groups is not None

    @property
    def points(self) -> int:
        """Number of groups per round (the explicit groups' count when given)."""
        return len(self.groups) if self.groups is not None else self.sync_points

    def tail_for(self, local_steps: int) -> int:
        """The tail steps for rounds of ``local_steps`` (the automatic value when null)."""
        if self.tail_steps is not None:
            return self.tail_steps
        return max(1, local_steps // (2 * max(self.points, 1)))

    @model_validator(mode="after")
    def _consistent(self) -> PartialSyncConfig:
        if self.groups is not None:
            if not self.groups or any(not group for group in self.groups):
                raise ValueError("groups must be non-empty lists of tensor-name patterns")
            if self.sync_points not in (0, len(self.groups)):
                raise ValueError(
                    f"sync_points {self.sync_points} but {len(self.groups)} groups are given; "
                    "leave sync_points out or make them equal"
                )
        if self.sync_points == 1:
            raise ValueError(
                "sync_points 1 sends the whole model after the last step, which is plain "
                "DiLoCo: use 0, or 2 or more to overlap transfers with training"
            )
        return self


class StreamingConfig(Section):
    """Streaming DiLoCo (Douillard et al., 2025): fragments synchronized in turn, overlapped.

    The model is cut into ``fragments`` P; each round synchronizes one of them, in turn,
    and trains H / P inner steps (H = schedule.diloco.local_steps), so every fragment has
    its outer step every H steps, staggered by H / P. A fragment's pseudo-gradient is sent
    ``overlap_steps`` before the round's steps end and travels while they train; the
    merged global fragment is mixed into the client's own at the start of its next fit.
    """

    fragments: int = Field(
        default=0,
        ge=0,
        description="P: fragments of the model, one synchronized per round; 0 = off. "
        "schedule.diloco.local_steps must be a multiple of P (rounds train H / P steps).",
    )
    overlap_steps: int = Field(
        default=1,
        ge=0,
        description="tau: inner steps trained while a fragment's upload is in flight; the "
        "global fragment is merged tau steps after it was sent. Less than H / P.",
    )
    mixing_alpha: float = Field(
        default=0.5,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="alpha: the merged fragment is alpha x local + (1 - alpha) x global "
        "(0 = take the global values, as plain DiLoCo does).",
    )
    groups: list[list[str]] | None = Field(
        default=None,
        description="Explicit fragments in sync order, as lists of tensor-name patterns "
        "(fnmatch); every tensor must match exactly one. null = the model's tensors in "
        "order, cut into P runs of near-equal bytes.",
    )

    @property
    def enabled(self) -> bool:
        """Whether rounds are Streaming DiLoCo rounds."""
        return self.fragments > 0 or self.groups is not None

    @property
    def count(self) -> int:
        """P (the explicit groups' count when given)."""
        return len(self.groups) if self.groups is not None else self.fragments

    @model_validator(mode="after")
    def _consistent(self) -> StreamingConfig:
        if self.groups is not None:
            if not self.groups or any(not group for group in self.groups):
                raise ValueError("groups must be non-empty lists of tensor-name patterns")
            if self.fragments not in (0, len(self.groups)):
                raise ValueError(
                    f"fragments {self.fragments} but {len(self.groups)} groups are given; "
                    "leave fragments out or make them equal"
                )
        return self
