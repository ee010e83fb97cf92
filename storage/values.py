"""Turning configs and metrics into values every database's JSON column accepts.

Metrics arrive as :data:`geofl.protocols.types.Scalar` values, NumPy scalars from
aggregation, and sometimes non-finite floats from a diverging model. PostgreSQL rejects
``NaN`` in JSON and nothing accepts ``bytes``, so values are normalised before they are
stored, and the config digest is computed over the normalised form.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

__all__ = ["aware_now", "choice", "config_digest", "json_object", "jsonable"]

_E = TypeVar("_E", bound=StrEnum)
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def jsonable(value: object, *, where: str = "value") -> Any:
    """Return ``value`` as plain JSON data.

    NumPy scalars and arrays become Python numbers and lists; non-finite floats become
    the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``; ``bytes`` become base64
    text; tuples become lists; mapping keys must be strings.

    Raises
    ------
    TypeError
        Something that has no JSON form (an object, a set...), named by its path.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return _NON_FINITE.get(value, value)
    if isinstance(value, np.generic | np.ndarray):
        return jsonable(value.tolist(), where=where)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is not a string")
            result[key] = jsonable(item, where=f"{where}.{key}")
        return result
    if isinstance(value, list | tuple):
        return [jsonable(item, where=f"{where}[{index}]") for index, item in enumerate(value)]
    raise TypeError(f"{where}: {type(value).__name__} cannot be stored as JSON")


def config_digest(config: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON form of a resolved run config.

    Two configs that differ only in key order hash the same; this is how a restarted
    coordinator recognises the run it should resume.
    """
    canonical = json.dumps(
        jsonable(config, where="config"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def json_object(value: Mapping[str, Any] | None, where: str) -> dict[str, Any]:
    """:func:`jsonable` for a dict-valued column (``None`` becomes ``{}``)."""
    result: dict[str, Any] = jsonable(dict(value or {}), where=where)
    return result


def aware_now(now: datetime | None) -> datetime:
    """``now`` if given (it must be timezone-aware), else the current UTC time.

    Callers on a virtual clock pass their own time; naive datetimes are ambiguous and
    rejected rather than guessed.
    """
    if now is None:
        return datetime.now(UTC)
    if now.tzinfo is None:
        raise ValueError(f"naive datetime {now.isoformat()} given; pass an aware UTC time")
    return now


def choice(vocabulary: type[_E], value: str, what: str) -> _E:
    """Validate ``value`` against an enum, naming the allowed values if it is not one.

    Raises
    ------
    ValueError
        ``value`` is not a member's value, e.g. ``status 'asleep' is not one of ...``.
    """
    try:
        return vocabulary(value)
    except ValueError:
        allowed = ", ".join(member.value for member in vocabulary)
        raise ValueError(f"{what} {value!r} is not one of: {allowed}") from None
