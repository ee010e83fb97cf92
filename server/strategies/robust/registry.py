"""Robust rules by the name a run's YAML gives them (``strategy.robust.rule``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from geofl.server.strategies.robust.clipping import AdaptiveClip, FixedClip
from geofl.server.strategies.robust.deferred import (
    CenteredClip,
    CoordinateMedian,
    Krum,
    MultiKrum,
    TrimmedMean,
)
from geofl.server.strategies.robust.rule import RobustRule

__all__ = ["ROBUST_RULES", "STREAMING_RULES", "make_rule"]

_RULES: tuple[type[RobustRule], ...] = (
    FixedClip,
    AdaptiveClip,
    CoordinateMedian,
    TrimmedMean,
    Krum,
    MultiKrum,
    CenteredClip,
)
#: Rule name -> class (read-only), in documentation order.
ROBUST_RULES: Mapping[str, type[RobustRule]] = MappingProxyType({r.name: r for r in _RULES})
#: The rules that fold each update as it arrives (no spill, O(model) memory).
STREAMING_RULES = frozenset({FixedClip.name, AdaptiveClip.name})


def make_rule(name: str, **params: Any) -> RobustRule:
    """Build the rule registered as ``name`` with its keyword settings.

    Raises
    ------
    ValueError
        If the name is unknown or a setting is unknown or out of range; the message names
        the rule.
    """
    try:
        cls = ROBUST_RULES[name]
    except KeyError:
        raise ValueError(f"unknown robust rule {name!r}; known: {sorted(ROBUST_RULES)}") from None
    try:
        return cls(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"robust rule {name!r}: {exc}") from exc
