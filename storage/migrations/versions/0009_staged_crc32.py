"""Staged updates are checked by CRC-32 instead of SHA-256.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07

Every accepted fit update is written to a staged file before its ack; hashing that file
with SHA-256 was most of the staging's CPU (30-36 ms per 40 MB update, against 0.6 ms
for zlib-ng's CRC-32). New rows hold ``crc32`` and no ``sha256``; rows written before
this revision keep their SHA-256 and are still verified by it. Downgrading refuses while
a row has no SHA-256 (clear ``staged_updates`` first: they are only needed by an
interrupted round).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "staged_updates"


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(sa.Column("crc32", sa.BigInteger(), nullable=True))
        batch.alter_column("sha256", existing_type=sa.String(64), nullable=True)


def downgrade() -> None:
    unhashed = (
        op.get_bind()
        .execute(sa.text(f"SELECT COUNT(*) FROM {_TABLE} WHERE sha256 IS NULL"))
        .scalar_one()
    )
    if unhashed:
        raise RuntimeError(
            f"{unhashed} staged update(s) have only a CRC-32; clear {_TABLE} before downgrading"
        )
    with op.batch_alter_table(_TABLE) as batch:
        batch.alter_column("sha256", existing_type=sa.String(64), nullable=False)
        batch.drop_column("crc32")
