"""The one error of ``geofl runs report|export`` beyond the storage ones."""

from __future__ import annotations

from geofl.protocols.errors import GeoflError

__all__ = ["ReportError"]


class ReportError(GeoflError):
    """A report or export cannot be written: its output folder is in the way, or the
    optional plotting dependency (matplotlib, ``geofl[report]``) is missing."""
