"""Exit codes of the ``geofl`` program (documented in ``geofl --help``)."""

from __future__ import annotations

import enum


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
    INTERRUPTED = 130


HELP: dict[ExitCode, str] = {
    ExitCode.OK: "success (the run completed; a client was told the run is over)",
    ExitCode.RUN_FAILED: "the run failed (too few clients connected in time) or a client failed",
    ExitCode.USAGE: "bad command line or configuration (the message names the key and file line)",
    ExitCode.STORAGE_UNAVAILABLE: "the database cannot be reached or opened",
    ExitCode.ADDRESS_IN_USE: "the listen address cannot be bound (port already in use?)",
    ExitCode.USER_CODE: "user code named in the configuration cannot be imported or misbehaves",
    ExitCode.SERVER_UNREACHABLE: "a client gave up: the server stayed unreachable",
    ExitCode.PROTOCOL: "client and server disagree on the protocol (version, session)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C / SIGTERM); a server's run stays resumable",
}


def epilog() -> str:
    """The exit-code table shown by ``geofl --help``."""
    lines = ["exit codes:"]
    lines += [f"  {int(code):>3}  {HELP[code]}" for code in ExitCode]
    return "\n".join(lines)


__all__ = ["HELP", "ExitCode", "epilog"]
