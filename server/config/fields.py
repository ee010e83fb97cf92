"""Field types shared by the configuration sections.

Each type validates one kind of value the YAML file holds (an import path, an address, a
scalar for clients, a path relative to the file) and carries a JSON-schema ``format`` that
the reference generator (:mod:`geofl.server.config.docs`) prints as the type's name.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
)

__all__ = [
    "BASE_DIR_KEY",
    "Address",
    "ConfigScalar",
    "DatabaseUrl",
    "ExistingFile",
    "ImportPath",
    "RelativePath",
    "ScalarMap",
    "Section",
    "is_loopback",
    "redact_url",
    "split_address",
]

#: Validation-context key holding the directory that relative paths resolve against.
BASE_DIR_KEY = "base_dir"

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_IMPORT_PATH = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}(?:\.{_IDENT})*")
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{1,5}")
_URL_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_SQLITE_URL = re.compile(
    r"(?P<prefix>sqlite(?:\+[A-Za-z0-9_]+)?:///)(?P<path>[^?]*)(?P<query>\?.*)?"
)
_URL_PASSWORD = re.compile(r"^(?P<head>[^:/?#]+://[^:/@?#]*:)[^@/]*@")


class Section(BaseModel):
    """Base of every configuration model: immutable, strict, and unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _check_import_path(value: str) -> str:
    if not _IMPORT_PATH.fullmatch(value):
        raise ValueError(f"expected 'package.module:attribute', got {value!r}")
    return value


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def split_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` (IPv6 hosts in brackets, ``[::1]:8443``) into host and port.

    Raises
    ------
    ValueError
        If the host is empty or malformed, or the port is not an integer in 0..65535.
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected host:port, got {address!r}")
    if not _PORT.fullmatch(port) or int(port) > 65535:
        raise ValueError(f"port must be an integer in 0..65535, got {port!r} in {address!r}")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"invalid IPv6 host {host!r} in {address!r}") from None
        return host[1:-1], int(port)
    if ":" in host:
        raise ValueError(f"an IPv6 host must be in brackets, e.g. [::1]:8443, got {address!r}")
    if not _HOSTNAME.fullmatch(host):
        raise ValueError(f"invalid host name {host!r} in {address!r}")
    return host, int(port)


def _check_address(value: str) -> str:
    split_address(value)
    return value


def _check_scalar(value: object) -> bool | int | float | str:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value}")
    if isinstance(value, bool | int | float | str):
        return value
    raise ValueError(f"expected a boolean, number or string, got {type(value).__name__}")


def _base_dir(info: ValidationInfo) -> Path | None:
    context = info.context
    if isinstance(context, Mapping):
        base = context.get(BASE_DIR_KEY)
        if isinstance(base, Path):
            return base
    return None


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    value = value.expanduser()
    base = _base_dir(info)
    if base is None or value.is_absolute():
        return value
    return Path(os.path.normpath(base / value))


def _check_file(value: Path) -> Path:
    if not value.is_file():
        raise ValueError(f"file not found: {value}")
    return value


def _check_database_url(value: str, info: ValidationInfo) -> str:
    if not _URL_SCHEME.match(value):
        raise ValueError(
            "expected a database URL such as sqlite:///runs/geofl.db or "
            f"postgresql+psycopg://user@host/db, got {redact_url(value)!r}"
        )
    match = _SQLITE_URL.fullmatch(value)
    if match is None:
        return value
    path = match["path"]
    if not path or path == ":memory:" or path.startswith("file:"):
        return value
    resolved = _resolve_path(Path(path), info)
    return f"{match['prefix']}{resolved}{match['query'] or ''}"


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***``, safe to log or store."""
    return _URL_PASSWORD.sub(r"\g<head>***@", url)


#: ``package.module:attribute``; checked for form only, imported by whoever uses it.
ImportPath = Annotated[
    str,
    AfterValidator(_check_import_path),
    WithJsonSchema({"type": "string", "format": "module:attr"}),
]
#: ``host:port`` with port in 0..65535; IPv6 hosts in brackets.
Address = Annotated[
    str, AfterValidator(_check_address), WithJsonSchema({"type": "string", "format": "host:port"})
]
#: A value sent to clients: boolean, integer, finite float or string.
ConfigScalar = Annotated[
    bool | int | float | str,
    PlainValidator(_check_scalar),
    WithJsonSchema({"type": ["boolean", "number", "string"]}),
]
#: A mapping of names to scalars, as sent to clients.
ScalarMap = dict[str, ConfigScalar]
#: A path; relative ones resolve against the YAML file's directory (``~`` expands).
RelativePath = Annotated[Path, Field(strict=False), AfterValidator(_resolve_path)]
#: A :data:`RelativePath` that must name an existing file when the configuration loads.
ExistingFile = Annotated[
    Path, Field(strict=False), AfterValidator(_resolve_path), AfterValidator(_check_file)
]
#: An SQLAlchemy URL; a relative SQLite file path resolves like :data:`RelativePath`.
DatabaseUrl = Annotated[
    str,
    AfterValidator(_check_database_url),
    WithJsonSchema({"type": "string", "format": "database URL"}),
]
