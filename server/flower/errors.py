"""What can go wrong when geofl runs a Flower app, as errors users can act on."""

from __future__ import annotations

from flwr.supercore.run import RunNotRunningException

from geofl.protocols.errors import GeoflError

__all__ = ["FlowerAppError", "GridClosedError", "UnsupportedFlowerFeatureError"]


class FlowerAppError(GeoflError):
    """A Flower app directory or component that geofl cannot load (the message says why)."""


class UnsupportedFlowerFeatureError(FlowerAppError):
    """The Flower app asks for something geofl does not run; the message says what instead."""


class GridClosedError(RunNotRunningException):
    """The run is over (or the server stopped): the grid takes no more calls.

    Flower's own grids signal this with ``RunNotRunningException``, a ``BaseException``
    on which Flower's helper threads (e.g. the legacy client-manager thread) stop.  It
    stays outside :class:`GeoflError` on purpose: as an ``Exception``, a ServerApp's own
    ``except Exception`` would swallow the end of its run.
    """
