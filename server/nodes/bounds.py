"""Bounds on every figure a node reports, checked before the server uses or stores it.

A result header carries numbers and metrics the node chose; each one ends up in the
aggregate (``num_examples`` is a FedAvg weight), the scheduler (``compute_s``) or a
database column (``participations.num_examples`` is a 32-bit ``INTEGER``; metrics are
JSON). A value out of range is refused here with a :class:`ProtocolError` naming the
field, so the servicer records a rejected participation with that reason: before these
checks, ``num_examples = 2**63`` overflowed the database column and ended the coordinator.

The limits follow the storage columns (:mod:`geofl.storage.models`) and what a metric is
for (a few numbers or a short label per result), not any particular model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from geofl.protocols.errors import ProtocolError
from geofl.protocols.types import Metrics, Scalar

__all__ = [
    "MAX_COMPUTE_S",
    "MAX_ERROR_CHARS",
    "MAX_METRICS",
    "MAX_METRIC_KEY_CHARS",
    "MAX_METRIC_VALUE_BYTES",
    "MAX_NUM_EXAMPLES",
    "Reported",
    "check_join",
    "check_metrics",
    "check_reported",
    "error_text",
    "poll_timeout",
]

#: ``participations.num_examples`` is a signed 32-bit INTEGER (SQLite and PostgreSQL).
MAX_NUM_EXAMPLES = 2**31 - 1
#: Seconds of compute a result may claim (a year: far beyond any round deadline).
MAX_COMPUTE_S = 365 * 86_400.0
#: Metrics per result.
MAX_METRICS = 256
#: Characters in a metric's name.
MAX_METRIC_KEY_CHARS = 128
#: Bytes (UTF-8) of one string or bytes metric value.
MAX_METRIC_VALUE_BYTES = 4096
#: Characters of a client's error text kept as the participation's reason.
MAX_ERROR_CHARS = 2000
#: ``nodes.name`` is VARCHAR(200), ``nodes.region`` VARCHAR(100) (PostgreSQL enforces it).
MAX_NODE_NAME_CHARS = 200
MAX_REGION_CHARS = 100
#: Largest integer a JSON metric keeps exactly in every reader (IEEE doubles).
_MAX_EXACT_INT = 2**53


@dataclass(frozen=True)
class Reported:
    """The figures of a result header, each within its bounds."""

    num_examples: int
    loss: float
    metrics: Metrics
    compute_s: float | None


def check_reported(
    *, num_examples: int, loss: float, metrics: Mapping[str, Scalar], compute_s: float, fit: bool
) -> Reported:
    """Check a result's figures; a fit must report at least one example.

    Raises
    ------
    ProtocolError
        Naming the field and the bound it is outside of.
    """
    low = 1 if fit else 0
    if not low <= num_examples <= MAX_NUM_EXAMPLES:
        what = "a fit result" if fit else "a result"
        raise ProtocolError(
            f"{what} must report {low} <= num_examples <= {MAX_NUM_EXAMPLES}, got {num_examples}"
        )
    if not math.isfinite(loss):
        raise ProtocolError(f"loss must be a finite number, got {loss!r}")
    if not (math.isfinite(compute_s) and 0.0 <= compute_s <= MAX_COMPUTE_S):
        raise ProtocolError(f"compute_s must be within [0, {MAX_COMPUTE_S:g}] s, got {compute_s!r}")
    return Reported(num_examples, loss, check_metrics(metrics), compute_s or None)


def check_metrics(metrics: Mapping[str, Scalar], what: str = "metric") -> Metrics:
    """The metrics as a plain dict if every name and value is within bounds.

    Raises
    ------
    ProtocolError
        Too many metrics, an empty or over-long name, a non-finite float, an integer
        beyond 2**53 (JSON readers lose it), or an over-long string or bytes value.
    """
    if len(metrics) > MAX_METRICS:
        raise ProtocolError(f"{len(metrics)} {what}s in one message, at most {MAX_METRICS}")
    for key, value in metrics.items():
        if not 0 < len(key) <= MAX_METRIC_KEY_CHARS:
            raise ProtocolError(
                f"a {what} name must have 1 to {MAX_METRIC_KEY_CHARS} characters, "
                f"got {len(key)} ({key[:40]!r}...)"
            )
        _check_value(f"{what} {key!r}", value)
    return dict(metrics)


def _check_value(named: str, value: Scalar) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{named} is {value!r}; values must be finite")
    if isinstance(value, int) and abs(value) > _MAX_EXACT_INT:
        raise ProtocolError(f"{named} = {value} is beyond +-2**53")
    size = (
        len(value.encode())
        if isinstance(value, str)
        else len(value)
        if isinstance(value, bytes)
        else 0
    )
    if size > MAX_METRIC_VALUE_BYTES:
        raise ProtocolError(f"{named} holds {size} bytes, at most {MAX_METRIC_VALUE_BYTES}")


def check_join(name: str, region: str | None, node_config: Mapping[str, Scalar]) -> None:
    """A join's name, region and node config within the ``nodes`` table's columns.

    Raises
    ------
    ProtocolError
        An over-long name or region, or a node config outside the metric bounds (it is
        stored as JSON like metrics are).
    """
    if len(name) > MAX_NODE_NAME_CHARS:
        raise ProtocolError(
            f"JoinRequest.node_name has {len(name)} characters, at most {MAX_NODE_NAME_CHARS}"
        )
    if region is not None and len(region) > MAX_REGION_CHARS:
        raise ProtocolError(
            f"JoinRequest.region has {len(region)} characters, at most {MAX_REGION_CHARS}"
        )
    check_metrics(node_config, "node config key")


def error_text(error: str, fallback: str = "client error") -> str:
    """A client's error message as a participation reason: at most MAX_ERROR_CHARS."""
    if not error:
        return fallback
    if len(error) <= MAX_ERROR_CHARS:
        return error
    return f"{error[:MAX_ERROR_CHARS]}... ({len(error)} characters, cut)"


def poll_timeout(requested: float, longest: float) -> float:
    """A long-poll's wait in [0, ``longest``] seconds; NaN (or any non-number) is 0."""
    if not math.isfinite(requested):
        return longest if requested > 0 else 0.0
    return min(max(requested, 0.0), longest)
