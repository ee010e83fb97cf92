"""Privacy accounting: ``rounds.epsilon``, the ε a run had spent after each round.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03

A nullable float: ε at the run's δ (its ``privacy.delta``) after the round committed, as
geofl's accountant (dp-accounting) computed it; ``NULL`` for runs without differential
privacy and for every round recorded before this revision. Downgrading drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.add_column(sa.Column("epsilon", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rounds") as batch:
        batch.drop_column("epsilon")
