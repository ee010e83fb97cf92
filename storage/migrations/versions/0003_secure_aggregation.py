"""Secure aggregation: its stages as round phases and as participation kinds.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29

A secure round passes through ``advertise`` and ``share`` before the broadcast and through
``unmask`` after the uploads; each stage hands every client a task whose outcome is recorded
as a participation of that kind, so a stage's dropouts are visible per client.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PHASES_BEFORE = ("select", "broadcast", "fit", "aggregate", "evaluate", "commit")
_PHASES_AFTER = (
    "select",
    "advertise",
    "share",
    "broadcast",
    "fit",
    "unmask",
    "aggregate",
    "evaluate",
    "commit",
)
_KINDS_BEFORE = ("fit", "evaluate")
_KINDS_AFTER = ("fit", "evaluate", "advertise", "share", "unmask")


def _in(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def _replace_check(table: str, name: str, condition: str) -> None:
    with op.batch_alter_table(table) as batch:
        batch.drop_constraint(op.f(name), type_="check")
        batch.create_check_constraint(op.f(name), condition)


def upgrade() -> None:
    _replace_check("rounds", "ck_rounds_phase", _in("phase", _PHASES_AFTER))
    _replace_check("participations", "ck_participations_kind", _in("kind", _KINDS_AFTER))


def downgrade() -> None:
    _replace_check("rounds", "ck_rounds_phase", _in("phase", _PHASES_BEFORE))
    _replace_check("participations", "ck_participations_kind", _in("kind", _KINDS_BEFORE))
