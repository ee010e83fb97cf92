"""Run lifecycle: ``cancelled`` and ``interrupted`` run statuses.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03

A run now ends ``completed`` (rounds committed), ``failed`` (no round committed, or an
error), ``cancelled`` (an operator stopped it: ``geofl runs stop``) or ``interrupted``
(SIGINT/SIGTERM: resumable, as a ``running`` run left by a crash is). Existing rows keep
their status. Downgrading folds the new statuses into the old ones: ``interrupted`` runs
become ``running`` (still resumable there), ``cancelled`` ones ``failed``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BEFORE = ("running", "completed", "failed")
_AFTER = ("running", "completed", "failed", "cancelled", "interrupted")
_FOLDED = {"interrupted": "running", "cancelled": "failed"}


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _replace_check(condition: str) -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_constraint(op.f("ck_runs_status"), type_="check")
        batch.create_check_constraint(op.f("ck_runs_status"), condition)


def upgrade() -> None:
    _replace_check(_in("status", _AFTER))


def downgrade() -> None:
    runs = sa.table("runs", sa.column("status", sa.String(16)))
    for new, old in _FOLDED.items():
        op.execute(runs.update().where(runs.c.status == new).values(status=old))
    _replace_check(_in("status", _BEFORE))
