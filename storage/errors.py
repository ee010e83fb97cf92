"""Exceptions raised by the storage layer.

Every error derives from :class:`StorageError`, so the server can translate the whole
family at its boundary (an exit code on the command line, a log line in a running
coordinator) without knowing SQLAlchemy's or the database driver's exception types.
"""

from __future__ import annotations

from geofl.protocols.errors import GeoflError

__all__ = [
    "CheckpointCorruptError",
    "DatabaseURLError",
    "RecordNotFoundError",
    "RoundStateError",
    "RunNotFoundError",
    "StorageError",
    "StorageUnavailableError",
]


class StorageError(GeoflError):
    """Base class of every error the storage layer raises on purpose."""


class DatabaseURLError(StorageError, ValueError):
    """A database URL is malformed or names a driver that is not installed."""


class StorageUnavailableError(StorageError):
    """The database cannot be reached or opened.

    Parameters
    ----------
    url:
        The database URL with any password replaced by ``***``.
    reason:
        One line saying why (refused connection, unknown host, bad password...).
    """

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"database {url} is unavailable: {reason}")


class CheckpointCorruptError(StorageError):
    """A checkpoint file is missing, truncated, or does not match its recorded digest."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"checkpoint {path} is corrupt: {reason}")


class RecordNotFoundError(StorageError, LookupError):
    """A row that a query needs (node, round, ...) does not exist."""


class RunNotFoundError(RecordNotFoundError):
    """No run has the requested id."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} does not exist")


class RoundStateError(StorageError):
    """A round was asked to change state in a way its current state forbids.

    For example committing a round twice, or restarting a round that is already
    committed (a resumed coordinator must continue after ``last_committed_round``).
    """
