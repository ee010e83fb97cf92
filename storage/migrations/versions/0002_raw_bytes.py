"""Traffic before compression: bytes_up_raw and bytes_down_raw on rounds and participations.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Existing rows were never compressed, so the raw counts start equal to the wire counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("rounds", "participations")
_COLUMNS = ("bytes_up_raw", "bytes_down_raw")


def upgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for column in _COLUMNS:
                batch.add_column(
                    sa.Column(column, sa.BigInteger(), server_default="0", nullable=False)
                )
        op.execute(f"UPDATE {table} SET bytes_up_raw = bytes_up, bytes_down_raw = bytes_down")


def downgrade() -> None:
    for table in _TABLES:
        with op.batch_alter_table(table) as batch:
            for column in _COLUMNS:
                batch.drop_column(column)
