"""Sections of ``simulation`` that model the WAN, the clients' hardware and the data split.

They live with the other configuration sections (not in :mod:`geofl.server.simulation`)
so that the dependency points one way: the simulator reads the configuration, never the
reverse. :mod:`geofl.server.simulation.links` re-exports them next to the code that uses
them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field, model_validator

from geofl.server.config.fields import Section

__all__ = [
    "SHARE_TOLERANCE",
    "TRACE_SUFFIXES",
    "ByRegionPartition",
    "ComputeConfig",
    "ConstantDistribution",
    "DirichletPartition",
    "Distribution",
    "Heterogeneity",
    "IidPartition",
    "LogNormalDistribution",
    "PartitionConfig",
    "RegionModel",
    "ShardsPartition",
    "UniformDistribution",
    "check_region_names",
    "check_shares",
    "trace_suffix_problem",
]

#: How far the region shares may sum from 1 (they are typed by hand, as decimals).
SHARE_TOLERANCE = 1e-6
#: File types a client trace may have; pickle is deliberately not among them.
TRACE_SUFFIXES = (".json", ".csv")
_REGION_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_SCHEMES = ("iid", "dirichlet", "shards", "by_region")
_CONVERT_HINT = "python -m geofl.server.simulation.traces convert IN.pkl OUT.json --trust-pickle"


def _exactly_one(model: Section, keys: tuple[str, ...], what: str) -> None:
    chosen = [key for key in keys if getattr(model, key) is not None]
    if len(chosen) != 1:
        got = ", ".join(chosen) if chosen else "none"
        raise ValueError(f"{what} takes exactly one of {', '.join(keys)}; got {got}")


def _bare_name_to_mapping(data: Any, names: tuple[str, ...]) -> Any:
    """``constant`` (a bare word) and ``constant:`` (null) both mean ``{constant: {}}``.

    ``names`` are the kinds without parameters, for which an empty mapping is all there is.
    """
    if isinstance(data, str) and data in names:
        return {data: {}}
    if isinstance(data, dict):
        return {key: {} if value is None and key in names else value for key, value in data.items()}
    return data


class RegionModel(Section):
    """One region of the WAN model: its share of the clients and its access link."""

    share: float = Field(
        gt=0, le=1, allow_inf_nan=False, description="Fraction of the clients in this region."
    )
    rtt_ms: float = Field(
        ge=0, allow_inf_nan=False, description="Round-trip time to the server, milliseconds."
    )
    up_mbps: float = Field(
        gt=0, allow_inf_nan=False, description="Upload rate of a client, Mbit/s (10^6 bit/s)."
    )
    down_mbps: float = Field(
        gt=0, allow_inf_nan=False, description="Download rate of a client, Mbit/s."
    )
    jitter_ms: float = Field(
        default=0.0,
        ge=0,
        allow_inf_nan=False,
        description="Each one-way delay varies uniformly by up to this much, milliseconds.",
    )
    loss: float = Field(
        default=0.0, ge=0, lt=1, allow_inf_nan=False, description="Packet loss rate, in [0, 1)."
    )


class LogNormalDistribution(Section):
    """Multipliers ``exp(N(0, sigma^2))``: median 1, a long tail of fast clients."""

    sigma: float = Field(
        gt=0, allow_inf_nan=False, description="Standard deviation of the log of the multiplier."
    )


class UniformDistribution(Section):
    """Multipliers drawn uniformly from ``[low, high]``."""

    low: float = Field(gt=0, allow_inf_nan=False, description="Smallest multiplier.")
    high: float = Field(gt=0, allow_inf_nan=False, description="Largest multiplier.")

    @model_validator(mode="after")
    def _ordered(self) -> UniformDistribution:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        return self


class ConstantDistribution(Section):
    """Every multiplier is 1: all clients equal."""


class Distribution(Section):
    """Per-client multipliers: exactly one of ``lognormal``, ``uniform``, ``constant``."""

    lognormal: LogNormalDistribution | None = Field(
        default=None, description="Log-normal multipliers, {sigma}."
    )
    uniform: UniformDistribution | None = Field(
        default=None, description="Uniform multipliers, {low, high}."
    )
    constant: ConstantDistribution | None = Field(
        default=None, description="No heterogeneity; may be written as the bare word constant."
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_constant(cls, data: Any) -> Any:
        return _bare_name_to_mapping(data, ("constant",))

    @model_validator(mode="after")
    def _one_kind(self) -> Distribution:
        _exactly_one(self, ("lognormal", "uniform", "constant"), "a distribution")
        return self


def _constant() -> Distribution:
    return Distribution(constant=ConstantDistribution())


class Heterogeneity(Section):
    """How clients differ: multipliers of compute speed and of bandwidth, one per client."""

    compute: Distribution = Field(
        default_factory=_constant,
        description="Multiplier of compute.samples_per_s, drawn once per client (seeded by "
        "run.seed).",
    )
    bandwidth: Distribution = Field(
        default_factory=_constant,
        description="Multiplier of the region's up and down rates, drawn once per client.",
    )


class ComputeConfig(Section):
    """Training speed of a typical client."""

    samples_per_s: float = Field(
        default=200.0,
        gt=0,
        allow_inf_nan=False,
        description="Training samples per second (forward and backward) of a client with "
        "multiplier 1.",
    )


class IidPartition(Section):
    """Shuffle and cut into near-equal parts."""


class DirichletPartition(Section):
    """Each label spread over clients by a Dirichlet(alpha) draw (Hsu et al., 2019)."""

    alpha: float = Field(
        gt=0, allow_inf_nan=False, description="Concentration; smaller means more label skew."
    )


class ShardsPartition(Section):
    """Sort by label, cut into shards, deal ``per_client`` to each (McMahan et al., 2017)."""

    per_client: int = Field(ge=1, description="Shards each client gets; 2 is the classic.")


class ByRegionPartition(Section):
    """Each region gets a label mix skewed by a Dirichlet(alpha) draw; IID within a region."""

    alpha: float = Field(
        gt=0, allow_inf_nan=False, description="Concentration; smaller means more skew."
    )


class PartitionConfig(Section):
    """How the simulator splits the data: exactly one of the schemes below."""

    iid: IidPartition | None = Field(default=None, description="IID split; written iid: {}.")
    dirichlet: DirichletPartition | None = Field(
        default=None, description="Label skew per client, {alpha}."
    )
    shards: ShardsPartition | None = Field(
        default=None, description="Pathological non-IID shards, {per_client}."
    )
    by_region: ByRegionPartition | None = Field(
        default=None, description="Label skew per region (needs simulation.regions), {alpha}."
    )

    @model_validator(mode="before")
    @classmethod
    def _bare_iid(cls, data: Any) -> Any:
        return _bare_name_to_mapping(data, ("iid",))

    @model_validator(mode="after")
    def _one_scheme(self) -> PartitionConfig:
        _exactly_one(self, _SCHEMES, "partition")
        return self

    @property
    def scheme(self) -> str:
        """The name of the chosen scheme: ``iid``, ``dirichlet``, ``shards`` or ``by_region``."""
        return next(k for k in _SCHEMES if getattr(self, k) is not None)


def check_shares(shares: Mapping[str, float]) -> None:
    """Raise unless the region shares sum to 1 within :data:`SHARE_TOLERANCE`.

    Raises
    ------
    ValueError
        Listing every share and their sum, so the user sees which one to fix.
    """
    if not shares:
        return
    total = math.fsum(shares.values())
    if abs(total - 1.0) > SHARE_TOLERANCE:
        listed = ", ".join(f"{name}={share:g}" for name, share in shares.items())
        raise ValueError(f"region shares must sum to 1, got {listed} (sum {total:.9g})")


def check_region_names(names: Iterable[str]) -> None:
    """Raise unless every region name is letters, digits, ``_``, ``.`` or ``-``."""
    bad = [name for name in names if not _REGION_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f"region names must be letters, digits, '_', '.' or '-', got {bad!r}")


def trace_suffix_problem(suffix: str) -> str | None:
    """Why a trace file with this suffix cannot be read, or ``None`` if it can."""
    if suffix.lower() in TRACE_SUFFIXES:
        return None
    return (
        f"a client trace must be JSON or CSV ({', '.join(TRACE_SUFFIXES)}), got "
        f"{suffix or 'no suffix'}; geofl never unpickles, so convert a FedScale pickle "
        f"you trust first: {_CONVERT_HINT}"
    )
