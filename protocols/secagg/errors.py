"""Secure-aggregation errors and the names of the protocol's stages."""

from __future__ import annotations

import enum

from geofl.protocols.errors import GeoflError


class SecAggStage(enum.StrEnum):
    """The four stages of SecAgg+, in order; the values are what records store."""

    ADVERTISE = "advertise"
    SHARE = "share"
    MASK = "mask"
    UNMASK = "unmask"


class SecAggError(GeoflError):
    """Secure aggregation was given bad input or was driven out of order."""


class SecAggAbortError(SecAggError):
    """Too few clients (or shares) remain for the round to finish securely.

    ``stage`` is a :class:`SecAggStage` value; ``reason`` is a sentence for a human,
    e.g. ``"run 1, round 4, stage unmask: 2 of 10 clients left, threshold 3"``.
    """

    def __init__(self, stage: str, reason: str) -> None:
        super().__init__(f"secure aggregation aborted: {reason}")
        self.stage = stage
        self.reason = reason


__all__ = ["SecAggAbortError", "SecAggError", "SecAggStage"]
