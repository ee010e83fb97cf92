"""Durable FedBuff rounds: one staged update per task, not per (round, node).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

FedBuff (``schedule.mode: async``) hands a fast node several tasks for the version being
built, so two accepted updates of one node can share a round number; keyed by (run,
round, node), the second would replace the first. Rows are now unique per (run, task):
an upload of the same task again still replaces its row, so nothing is counted twice.
Downgrading restores the old key; it fails if a run has two staged rows of one node and
round (clear ``staged_updates`` first: they are only needed by an interrupted round).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "staged_updates"
_OLD = f"uq_{_TABLE}_run_id_round_node_id"
_NEW = f"uq_{_TABLE}_run_id_task_id"


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_constraint(_OLD, type_="unique")
        batch.create_unique_constraint(_NEW, ["run_id", "task_id"])


def downgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_constraint(_NEW, type_="unique")
        batch.create_unique_constraint(_OLD, ["run_id", "round", "node_id"])
