"""Reading a run's events: the audit log ``geofl runs logs`` and ``runs show`` print.

Events are written by :func:`geofl.storage.runs.add_event` (run lifecycle, round ends,
refused identities, Flower's records); ids grow with time, so a follower asks for the
ones after the last id it saw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from geofl.storage.models import Event

__all__ = ["EventRecord", "events_of"]


@dataclass(frozen=True)
class EventRecord:
    """One event row of a run."""

    id: int
    run_id: int | None
    round: int | None
    kind: str
    message: str
    data: dict[str, Any]
    created_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (``created_at`` as ISO 8601)."""
        values = dataclasses.asdict(self)
        values["created_at"] = self.created_at.isoformat()
        return values


def events_of(
    session: Session,
    run_id: int,
    *,
    after_id: int = 0,
    prefixes: Sequence[str] = (),
    limit: int | None = None,
) -> list[EventRecord]:
    """The run's events with an id above ``after_id``, oldest first.

    ``prefixes`` keeps only kinds starting with one of them (``("security.", "run.")``);
    ``limit`` caps how many come back (a follower pages through a long log).
    """
    statement = select(Event).where(Event.run_id == run_id, Event.id > after_id)
    if prefixes:
        statement = statement.where(or_(*(Event.kind.startswith(p) for p in prefixes)))
    statement = statement.order_by(Event.id)
    if limit is not None:
        statement = statement.limit(limit)
    return [
        EventRecord(
            id=row.id,
            run_id=row.run_id,
            round=row.round,
            kind=row.kind,
            message=row.message,
            data=dict(row.data),
            created_at=row.created_at,
        )
        for row in session.scalars(statement)
    ]
