"""The error of distributed differential privacy's client-and-server arithmetic."""

from __future__ import annotations

from geofl.protocols.errors import GeoflError

__all__ = ["DistributedDpError"]


class DistributedDpError(GeoflError, ValueError):
    """Parameters of the distributed discrete Gaussian mechanism that cannot hold: a ring
    too small for the cohort, a non-finite update, a noise below one integer step."""
