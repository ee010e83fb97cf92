"""Read-only records returned by the query functions (and printed by ``geofl runs``).

They are frozen dataclasses rather than ORM rows so a caller can keep them after the
session closes and cannot change the database by accident. ``to_dict()`` gives plain
JSON values: datetimes as ISO 8601 strings, nested records as dicts and lists.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self

__all__ = ["ParticipationRecord", "RoundSummary", "RunDetail", "RunSummary"]


def _plain(value: object) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def _revived(kind: Any, value: Any) -> Any:
    """``value`` (from :func:`_plain`) back as ``kind``: datetimes and nested records."""
    if value is None:
        return None
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        options = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        return _revived(options[0], value) if len(options) == 1 else value
    if kind is datetime:
        return datetime.fromisoformat(value)
    if isinstance(kind, type) and issubclass(kind, _JSONRecord):
        return kind.from_dict(value)
    if origin is tuple:
        item = typing.get_args(kind)[0]
        return tuple(_revived(item, entry) for entry in value)
    return value


class _JSONRecord:
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of this record (datetimes as ISO strings)."""
        result: dict[str, Any] = _plain(self)
        return result

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """The record :meth:`to_dict` gave ``data`` of (e.g. after a trip through JSON).

        Raises
        ------
        TypeError
            If ``data`` misses a field or has one the record does not.
        """
        hints = typing.get_type_hints(cls)
        names = {field.name for field in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(data) - names
        if unknown:
            raise TypeError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
        return cls(**{name: _revived(hints[name], data[name]) for name in names if name in data})


@dataclass(frozen=True)
class RunSummary(_JSONRecord):
    """One line of ``geofl runs list``: a run and its totals."""

    id: int
    name: str
    status: str
    config_sha256: str
    rounds_planned: int
    last_committed_round: int
    simulated_clock: bool
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    error: str | None
    num_nodes: int
    bytes_up: int
    bytes_down: int
    bytes_up_raw: int
    bytes_down_raw: int


@dataclass(frozen=True)
class RoundSummary(_JSONRecord):
    """A round's outcome: counts, traffic, losses, metrics and phase timings."""

    id: int
    number: int
    status: str
    phase: str
    started_at: datetime
    finished_at: datetime | None
    duration_s: float | None
    cohort_target: int
    num_selected: int
    num_succeeded: int
    num_failed: int
    bytes_up: int
    bytes_down: int
    bytes_up_raw: int
    bytes_down_raw: int
    train_loss: float | None
    fit_metrics: dict[str, Any]
    eval_loss: float | None
    eval_metrics: dict[str, Any]
    server_eval_loss: float | None
    server_eval_metrics: dict[str, Any]
    phase_durations: dict[str, Any]
    checkpoint_id: int | None
    error: str | None
    #: ε at the run's δ after this round (None without privacy).
    epsilon: float | None = None


@dataclass(frozen=True)
class ParticipationRecord(_JSONRecord):
    """One task attempt, with the round number and the node's name and region."""

    id: int
    round_id: int
    round_number: int
    node_id: int
    node_name: str
    node_region: str | None
    task_id: int
    kind: str
    attempt: int
    status: str
    reason: str | None
    num_examples: int
    bytes_up: int
    bytes_down: int
    bytes_up_raw: int
    bytes_down_raw: int
    compute_s: float | None
    duration_s: float | None
    loss: float | None
    metrics: dict[str, Any]
    started_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class RunDetail(_JSONRecord):
    """Everything ``geofl runs show`` prints: the run, its config, rounds and tasks."""

    run: RunSummary
    config: dict[str, Any]
    rounds: tuple[RoundSummary, ...]
    participations: tuple[ParticipationRecord, ...]
