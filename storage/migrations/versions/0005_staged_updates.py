"""Durable rounds: staged_updates, the accepted fit updates a round has not yet committed.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

One row per (run, round, node): where the update's safetensors file is, its SHA-256 and
size, and the figures its participation will carry. The server writes the row before it
acknowledges the upload, so a coordinator killed in the middle of a round folds these
updates again on restart instead of asking their nodes to train twice. Rows go with their
run and with their node (``ON DELETE CASCADE``). Existing databases start with none.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "staged_updates"


def _fk(column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{_TABLE}_{column}_{target}"), ondelete="CASCADE"
    )


def _bytes(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.BigInteger(), server_default="0", nullable=False)


def upgrade() -> None:
    op.create_table(
        _TABLE,
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("model_version", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("num_tensors", sa.Integer(), nullable=False),
        sa.Column("num_examples", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("compute_s", sa.Float(), nullable=True),
        _bytes("bytes_up"),
        _bytes("bytes_up_raw"),
        _bytes("bytes_down"),
        _bytes("bytes_down_raw"),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        _fk("run_id", "runs"),
        _fk("node_id", "nodes"),
        sa.PrimaryKeyConstraint("id", name=op.f(f"pk_{_TABLE}")),
        sa.UniqueConstraint(
            "run_id", "round", "node_id", name=op.f(f"uq_{_TABLE}_run_id_round_node_id")
        ),
    )
    op.create_index(op.f(f"ix_{_TABLE}_run_id"), _TABLE, ["run_id"])


def downgrade() -> None:
    op.drop_index(op.f(f"ix_{_TABLE}_run_id"), table_name=_TABLE)
    op.drop_table(_TABLE)
