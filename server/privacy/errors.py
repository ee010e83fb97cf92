"""The error of the privacy layer: a setting that would not give the promised guarantee."""

from __future__ import annotations

from geofl.protocols.errors import GeoflError

__all__ = ["PrivacyError"]


class PrivacyError(GeoflError, ValueError):
    """A privacy setting cannot hold: missing ``dp-accounting``, a budget already spent,
    a composition that would be accounted wrongly. A ValueError too, so the run
    configuration's validators report it as a configuration error."""
