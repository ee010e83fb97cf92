"""Robust aggregation: rules that bound what a malicious client can do to the model.

Streaming (O(model) memory): :class:`FixedClip`, :class:`AdaptiveClip`. Spilled to
memory-mapped files (O(block) memory, ``8 x parameters x n`` bytes of disk per round):
:class:`CoordinateMedian`, :class:`TrimmedMean`, :class:`Krum`, :class:`MultiKrum`,
:class:`CenteredClip`. :class:`RobustStrategy` puts one in front of a server optimizer.
See docs/robust.md for each rule's threat model.
"""

from geofl.server.strategies.robust.clipping import (
    AdaptiveClip,
    ClippedMean,
    FixedClip,
    QuantileClipNorm,
)
from geofl.server.strategies.robust.deferred import (
    CenteredClip,
    CoordinateMedian,
    DeferredRule,
    Krum,
    MultiKrum,
    SpilledAccumulator,
    TrimmedMean,
)
from geofl.server.strategies.robust.registry import ROBUST_RULES, make_rule
from geofl.server.strategies.robust.rule import RobustRule
from geofl.server.strategies.robust.strategy import RobustStrategy

__all__ = [
    "ROBUST_RULES",
    "AdaptiveClip",
    "CenteredClip",
    "ClippedMean",
    "CoordinateMedian",
    "DeferredRule",
    "FixedClip",
    "Krum",
    "MultiKrum",
    "QuantileClipNorm",
    "RobustRule",
    "RobustStrategy",
    "SpilledAccumulator",
    "TrimmedMean",
    "make_rule",
]
