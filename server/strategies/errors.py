"""Errors raised by server strategies.

One small hierarchy so the round engine can tell a bad client update (reject that client,
carry on with the round) from a broken aggregate or state (stop and report).
"""

from __future__ import annotations

from geofl.protocols.errors import GeoflError

__all__ = ["StrategyError", "UpdateRejected"]


class StrategyError(GeoflError):
    """A strategy could not aggregate, step or restore its state."""


class UpdateRejected(StrategyError):  # noqa: N818 - the name reads as the event it reports
    """One client update failed validation and was not folded into the aggregate.

    Parameters
    ----------
    reason
        What was wrong, naming the tensor and the expected versus received value.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
