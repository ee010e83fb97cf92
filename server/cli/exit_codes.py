"""Exit codes of the ``geofl`` program (documented in ``geofl --help``), and the one
mapping from the exceptions a command lets through to the code it exits with.

Nothing is imported at the top beyond the standard library: ``geofl --help`` and
``geofl client`` import this module, and must stay cheap (and work without Flower).
"""

from __future__ import annotations

import enum
import sys


class ExitCode(enum.IntEnum):
    """What a non-zero exit means; every code has help text."""

    OK = 0
    RUN_FAILED = 1
    USAGE = 2
    STORAGE_UNAVAILABLE = 3
    ADDRESS_IN_USE = 4
    USER_CODE = 5
    SERVER_UNREACHABLE = 6
    PROTOCOL = 7
    IDENTITY_REFUSED = 8
    TLS_VERIFICATION = 9
    CREDENTIALS = 10
    CANCELLED = 11
    INTERRUPTED = 130


HELP: dict[ExitCode, str] = {
    ExitCode.OK: "success (the run completed; a client was told the run is over)",
    ExitCode.RUN_FAILED: "the run failed (no round committed, too few clients in time) or a "
    "client failed",
    ExitCode.USAGE: "bad command line or configuration (the message names the key and file line)",
    ExitCode.STORAGE_UNAVAILABLE: "the database cannot be reached or opened",
    ExitCode.ADDRESS_IN_USE: "a listen address (server, metrics) cannot be bound (port in use?)",
    ExitCode.USER_CODE: "user code named in the configuration cannot be imported or misbehaves",
    ExitCode.SERVER_UNREACHABLE: "a client gave up: the server stayed unreachable",
    ExitCode.PROTOCOL: "client and server disagree on the protocol (version, session)",
    ExitCode.IDENTITY_REFUSED: "the server refused this node's identity (unknown or revoked key)",
    ExitCode.TLS_VERIFICATION: "a TLS certificate could not be verified (wrong CA, name)",
    ExitCode.CREDENTIALS: "a certificate or key file is missing, unreadable or not a key",
    ExitCode.CANCELLED: "the run was cancelled (geofl runs stop, or its privacy budget ran out)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C / SIGTERM); a server's run is left interrupted "
    "and resumes when started again",
}

#: (defining module, class name, code), most specific class first. Classes are named, not
#: imported: a class whose module was never imported has no instances to map, and importing
#: them here would load Flower (optional) and the configuration models on every error.
CODES: tuple[tuple[str, str, ExitCode], ...] = (
    ("builtins", "KeyboardInterrupt", ExitCode.INTERRUPTED),
    ("geofl.server.config.errors", "ConfigError", ExitCode.USAGE),
    ("geofl.storage.errors", "StorageUnavailableError", ExitCode.STORAGE_UNAVAILABLE),
    ("geofl.server.coordinator", "AddressInUseError", ExitCode.ADDRESS_IN_USE),
    ("geofl.server.metrics.endpoint", "MetricsAddressError", ExitCode.ADDRESS_IN_USE),
    ("geofl.server.models.loading", "UserCodeError", ExitCode.USER_CODE),
    ("geofl.server.flower.errors", "FlowerAppError", ExitCode.USER_CODE),
    ("geofl.client.runtime", "GaveUpError", ExitCode.SERVER_UNREACHABLE),
    ("geofl.protocols.errors", "IdentityRefusedError", ExitCode.IDENTITY_REFUSED),
    ("geofl.client.connection", "TlsVerificationError", ExitCode.TLS_VERIFICATION),
    ("geofl.client.connection", "CredentialsError", ExitCode.CREDENTIALS),
    ("geofl.protocols.identity", "KeyFileError", ExitCode.CREDENTIALS),
)
_GEOFL_ERROR = ("geofl.protocols.errors", "GeoflError")


def epilog() -> str:
    """The exit-code table shown by ``geofl --help``."""
    lines = ["exit codes:"]
    lines += [f"  {int(code):>3}  {HELP[code]}" for code in ExitCode]
    return "\n".join(lines)


def _loaded_class(module: str, name: str) -> type[BaseException] | None:
    """The class ``module.name`` if its module is imported (else it has no instances)."""
    found = sys.modules.get(module)
    if found is None:
        return None
    cls: type[BaseException] = getattr(found, name)
    return cls


def _geofl_error_code(exc: BaseException) -> ExitCode | None:
    """Any other :class:`GeoflError`: a protocol disagreement (a :class:`WireError` with
    code ``PROTOCOL_VERSION``), or else a failed run."""
    geofl_error = _loaded_class(*_GEOFL_ERROR)
    if geofl_error is None or not isinstance(exc, geofl_error):
        return None
    protocol = sys.modules[_GEOFL_ERROR[0]].ErrorCode.PROTOCOL_VERSION
    return ExitCode.PROTOCOL if getattr(exc, "code", None) is protocol else ExitCode.RUN_FAILED


def exit_code_for(exc: BaseException) -> ExitCode:
    """The code a command exits with when ``exc`` ends it (``geofl server``, ``simulate``,
    ``relay`` and their Flower variants all use this one mapping).

    Raises
    ------
    BaseException
        ``exc`` itself when no code fits: an unexpected error keeps its traceback (and the
        interpreter's exit status 1) instead of being reduced to a one-line message.
    """
    for module, name, code in CODES:
        cls = _loaded_class(module, name)
        if cls is not None and isinstance(exc, cls):
            return code
    fallback = _geofl_error_code(exc)
    if fallback is None:
        raise exc
    return fallback


__all__ = ["CODES", "HELP", "ExitCode", "epilog", "exit_code_for"]
