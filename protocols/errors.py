"""Catalogued error codes shared by server and client, and geofl's one exception tree.

:class:`GeoflError` is the base of every error geofl raises on purpose; on its own it
carries a message and nothing else.  The errors that cross the wire derive from
:class:`WireError`: each carries a catalogued :class:`ErrorCode`.  A server-side
:class:`WireError` is translated once, at the RPC boundary, into a gRPC status whose
details start with the catalogued code (``"GEOFL-E104: ..."``); the client translates
it back into the most specific :class:`WireError` subclass.  Any other error that
reaches the boundary, a local :class:`GeoflError` included, is an internal error
(``E199``) whose details are not sent.

Every exception class in geofl, by module (``(also X)``: a builtin or Flower base kept
beside the geofl one, so ``except X`` still catches it)::

    GeoflError                                          geofl.protocols.errors
    ├── WireError                                       geofl.protocols.errors
    │   ├── ProtocolError                               geofl.protocols.errors
    │   │   ├── TruncatedStreamError                    geofl.protocols.errors
    │   │   ├── TensorError                             geofl.protocols.errors
    │   │   │   └── NonFiniteError                      geofl.protocols.errors
    │   │   ├── ChecksumError                           geofl.protocols.errors
    │   │   └── CodecError (also ValueError)            geofl.protocols.codecs.base
    │   ├── SessionError                                geofl.protocols.errors
    │   ├── IdentityRefusedError                        geofl.protocols.errors
    │   ├── ForbiddenError                              geofl.protocols.errors
    │   ├── TaskError                                   geofl.protocols.errors
    │   └── RunFinishedError                            geofl.protocols.errors
    ├── SecAggError                                     geofl.protocols.secagg.errors
    │   └── SecAggAbortError                            geofl.protocols.secagg.errors
    ├── DistributedDpError (also ValueError)            geofl.protocols.ddp.errors
    ├── StorageError                                    geofl.storage.errors
    │   ├── DatabaseURLError (also ValueError)          geofl.storage.errors
    │   ├── StorageUnavailableError                     geofl.storage.errors
    │   ├── CheckpointCorruptError                      geofl.storage.errors
    │   ├── RecordNotFoundError (also LookupError)      geofl.storage.errors
    │   │   └── RunNotFoundError                        geofl.storage.errors
    │   └── RoundStateError                             geofl.storage.errors
    ├── KeyFileError                                    geofl.protocols.identity
    ├── ConfigError                                     geofl.server.config.errors
    ├── AddressInUseError                               geofl.server.coordinator
    ├── MetricsAddressError                             geofl.server.metrics.endpoint
    ├── DashboardAddressError                           geofl.server.dashboard.server
    ├── FlowerAppError                                  geofl.server.flower.errors
    │   └── UnsupportedFlowerFeatureError               geofl.server.flower.errors
    ├── CredentialFileError                             geofl.server.cli.credentials
    ├── ControlError                                    geofl.server.control.client
    ├── UserCodeError                                   geofl.server.models.loading
    ├── RegionalError                                   geofl.server.relay.rounds
    ├── ReportError                                     geofl.server.reports.errors
    ├── RoundFailedError                                geofl.server.rounds.records
    ├── NoClientsError                                  geofl.server.rounds.records
    ├── PartialSyncError (also ValueError)              geofl.server.scheduling.partial_sync
    ├── StreamingError (also ValueError)                geofl.server.scheduling.streaming
    ├── BackendError                                    geofl.server.simulation.backends
    ├── ShaperConfigError (also ValueError)             geofl.server.simulation.shaper
    ├── ShaperStartError (also RuntimeError)            geofl.server.simulation.shaper
    ├── TraceError                                      geofl.server.simulation.trace_format
    ├── PrivacyError (also ValueError)                  geofl.server.privacy.errors
    ├── StrategyError                                   geofl.server.strategies.errors
    │   └── UpdateRejected                              geofl.server.strategies.errors
    ├── FlowerConfigError (also ValueError)             geofl.server.strategies._flower_names
    ├── ClientAppError                                  geofl.client.app
    ├── ServerUnavailableError                          geofl.client.connection
    ├── CredentialsError                                geofl.client.connection
    ├── TlsVerificationError                            geofl.client.connection
    ├── FlowerReplyError                                geofl.client.flower.records
    ├── PartitionError (also ValueError)                geofl.client.partition
    ├── PartitionFileError (also ValueError)            geofl.client.partition
    └── GaveUpError                                     geofl.client.runtime

One class stays outside the tree on purpose: ``GridClosedError``
(``geofl.server.flower.errors``) is Flower's ``RunNotRunningException``, a
``BaseException`` that a ServerApp's ``except Exception`` must not swallow.

``tests/project/test_exceptions.py`` checks that this drawing names every exception
class of geofl with its true parent and extra bases.
"""

from __future__ import annotations

import enum
from typing import ClassVar

import grpc


class ErrorCode(enum.Enum):
    """Every error a peer may see on the wire: (code, gRPC status, meaning)."""

    PROTOCOL_VERSION = ("E100", grpc.StatusCode.FAILED_PRECONDITION, "no common protocol version")
    UNKNOWN_NODE = ("E101", grpc.StatusCode.UNAUTHENTICATED, "unknown or expired node session")
    UNKNOWN_TASK = ("E102", grpc.StatusCode.NOT_FOUND, "task is not assigned to this node")
    TASK_EXPIRED = ("E103", grpc.StatusCode.DEADLINE_EXCEEDED, "the task's deadline has passed")
    MALFORMED_MESSAGE = ("E104", grpc.StatusCode.INVALID_ARGUMENT, "malformed message")
    TENSOR_MISMATCH = (
        "E105",
        grpc.StatusCode.INVALID_ARGUMENT,
        "tensor names/shapes/dtypes differ",
    )
    NON_FINITE = ("E106", grpc.StatusCode.INVALID_ARGUMENT, "tensor holds NaN or Inf values")
    CHECKSUM = ("E107", grpc.StatusCode.DATA_LOSS, "chunk checksum mismatch")
    TOO_LARGE = ("E108", grpc.StatusCode.RESOURCE_EXHAUSTED, "message or model exceeds limits")
    MODEL_UNAVAILABLE = ("E109", grpc.StatusCode.NOT_FOUND, "model version not available")
    DUPLICATE_RESULT = ("E110", grpc.StatusCode.ALREADY_EXISTS, "result already submitted")
    RUN_FINISHED = ("E111", grpc.StatusCode.FAILED_PRECONDITION, "the run is over")
    UNKNOWN_REGION = ("E112", grpc.StatusCode.FAILED_PRECONDITION, "region not served by the run")
    IDENTITY_REFUSED = (
        "E113",
        grpc.StatusCode.UNAUTHENTICATED,
        "node identity refused (unknown or revoked key, bad proof, or another node's name)",
    )
    FORBIDDEN = ("E114", grpc.StatusCode.PERMISSION_DENIED, "not permitted for this node")
    INTERNAL = ("E199", grpc.StatusCode.INTERNAL, "internal server error")

    def __init__(self, code: str, status: grpc.StatusCode, meaning: str) -> None:
        self.code = code
        self.status = status
        self.meaning = meaning

    @classmethod
    def from_code(cls, code: str) -> ErrorCode | None:
        """The member with catalogue code ``code``, or ``None``."""
        return next((member for member in cls if member.code == code), None)


class GeoflError(Exception):
    """Base of every error geofl raises on purpose: a message, and no wire code.

    Catch it to handle any deliberate geofl error; an error a peer may see on the wire
    is a :class:`WireError`.
    """


class WireError(GeoflError):
    """An error a peer may see on the wire: it carries its catalogued :class:`ErrorCode`.

    ``error_code`` is the class's code; ``code`` the instance's (the class's unless
    given, e.g. a :class:`TaskError` for an expired task carries ``TASK_EXPIRED``).
    """

    error_code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(self, message: str, *, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code or self.error_code

    def wire_details(self) -> str:
        """The text carried in the gRPC status details."""
        return f"GEOFL-{self.code.code}: {self}"


class ProtocolError(WireError):
    """A peer sent something that violates the wire protocol."""

    error_code = ErrorCode.MALFORMED_MESSAGE


class TruncatedStreamError(ProtocolError):
    """A tensor stream ended early: the peer went away or stopped mid-upload."""


class TensorError(ProtocolError):
    """Tensors that do not match the model's specification."""

    error_code = ErrorCode.TENSOR_MISMATCH


class NonFiniteError(TensorError):
    """A tensor carries NaN or Inf."""

    error_code = ErrorCode.NON_FINITE


class ChecksumError(ProtocolError):
    """A chunk's data does not match its CRC-32."""

    error_code = ErrorCode.CHECKSUM


class SessionError(WireError):
    """The node's session is unknown to the server (e.g. after a restart)."""

    error_code = ErrorCode.UNKNOWN_NODE


class IdentityRefusedError(WireError):
    """The server does not accept this node's identity; retrying cannot help."""

    error_code = ErrorCode.IDENTITY_REFUSED


class ForbiddenError(WireError):
    """An authenticated node asked for something that is not its own (recorded)."""

    error_code = ErrorCode.FORBIDDEN


class TaskError(WireError):
    """A result for a task that is not (or no longer) assigned to this node."""

    error_code = ErrorCode.UNKNOWN_TASK


class RunFinishedError(WireError):
    """The run is over; no more tasks or results are accepted."""

    error_code = ErrorCode.RUN_FINISHED


_BY_CODE: dict[ErrorCode, type[WireError]] = {
    ErrorCode.MALFORMED_MESSAGE: ProtocolError,
    ErrorCode.TENSOR_MISMATCH: TensorError,
    ErrorCode.NON_FINITE: NonFiniteError,
    ErrorCode.CHECKSUM: ChecksumError,
    ErrorCode.UNKNOWN_NODE: SessionError,
    ErrorCode.IDENTITY_REFUSED: IdentityRefusedError,
    ErrorCode.FORBIDDEN: ForbiddenError,
    ErrorCode.UNKNOWN_TASK: TaskError,
    ErrorCode.TASK_EXPIRED: TaskError,
    ErrorCode.DUPLICATE_RESULT: TaskError,
    ErrorCode.RUN_FINISHED: RunFinishedError,
}


def error_from_details(details: str | None) -> WireError | None:
    """Rebuild the specific error from gRPC status details, if they carry a code."""
    if not details or not details.startswith("GEOFL-"):
        return None
    code_text, _, message = details[len("GEOFL-") :].partition(": ")
    code = ErrorCode.from_code(code_text)
    if code is None:
        return None
    return _BY_CODE.get(code, WireError)(message, code=code)


__all__ = [
    "ChecksumError",
    "ErrorCode",
    "ForbiddenError",
    "GeoflError",
    "IdentityRefusedError",
    "NonFiniteError",
    "ProtocolError",
    "RunFinishedError",
    "SessionError",
    "TaskError",
    "TensorError",
    "TruncatedStreamError",
    "WireError",
    "error_from_details",
]
