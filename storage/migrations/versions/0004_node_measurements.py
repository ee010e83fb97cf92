"""Link measurements: node_measurements, the server's estimates of each node after a round.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29

One row per (round, node): round-trip time, downlink and uplink throughput, compute speed
and availability as the server had estimated them once the round was over (each ``NULL``
until first observed), with how many tasks went into them. Rows go with their round and
with their node (``ON DELETE CASCADE``). Existing databases start with no measurements.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "node_measurements"
_ESTIMATES = ("rtt_s", "down_bps", "up_bps", "samples_per_s", "availability")


def _fk(column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{_TABLE}_{column}_{target}"), ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in _ESTIMATES),
        sa.Column("observations", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_round", sa.Integer(), nullable=True),
        _fk("round_id", "rounds"),
        _fk("node_id", "nodes"),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{_TABLE}")),
        sa.UniqueConstraint("round_id", "node_id", name=op.f(f"uq_{_TABLE}_round_id_node_id")),
    )
    op.create_index(op.f(f"ix_{_TABLE}_node_id"), _TABLE, ["node_id"])


def downgrade() -> None:
    op.drop_index(op.f(f"ix_{_TABLE}_node_id"), table_name=_TABLE)
    op.drop_table(_TABLE)
