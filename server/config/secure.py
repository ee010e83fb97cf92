"""The ``secure_aggregation`` section: SecAgg+ parameters (see docs/secure-aggregation.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from geofl.server.config.fields import Section

__all__ = ["LowRankConfig", "SecureAggregationConfig"]


class LowRankConfig(Section):
    """A low-rank projection shared by the cohort, so it composes with masking."""

    rank: int = Field(ge=1, description="Columns of the shared random basis.")
    min_elements: int = Field(default=4096, ge=1, description="Smaller tensors are sent whole.")


class SecureAggregationConfig(Section):
    """The server learns only the cohort's sum; see docs/secure-aggregation.md."""

    enabled: bool = Field(
        default=False, description="Mask every update so that only the cohort's sum is revealed."
    )
    degree: Annotated[int, Field(ge=2)] | Literal["auto", "full"] = Field(
        default="auto",
        description="Neighbours each client shares secrets with: a number (odd ones become even "
        "for odd cohorts), 'full' (every other client; small cohorts) or 'auto' "
        "(2 ceil(1.5 log2 n), the SecAgg+ regime).",
    )
    threshold: float = Field(
        default=0.66,
        gt=0.5,
        le=1.0,
        allow_inf_nan=False,
        description="Fraction of a client's neighbourhood (itself included) needed to rebuild "
        "its secrets; above 0.5 so that no two disjoint groups can both reconstruct.",
    )
    clip: float = Field(
        default=8.0,
        ge=1.0,
        allow_inf_nan=False,
        description="Each coordinate of a (weighted) update is clipped to [-clip, clip]; at "
        "least 1 because the client's weight (at most 1) travels in the same vector.",
    )
    ring_bits: int = Field(
        default=32,
        ge=8,
        le=32,
        description="Masked arithmetic is modulo 2^ring_bits; 16 halves the upload (coarser "
        "quantization: 2^ring_bits / cohort levels per coordinate).",
    )
    max_examples: int = Field(
        default=10_000,
        ge=1,
        description="A client's weight is min(num_examples, max_examples) / max_examples.",
    )
    low_rank: LowRankConfig | None = Field(
        default=None,
        description="Project matrix-shaped updates on a shared random basis of this rank "
        "before masking (with error feedback on the client); null = send them whole.",
    )
    stage_deadline_s: float = Field(
        default=60.0,
        gt=0,
        allow_inf_nan=False,
        description="Deadline of each key-exchange and unmasking stage, seconds.",
    )
