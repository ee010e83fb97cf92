"""Initial schema: runs, nodes, checkpoints, rounds, participations, events.

Revision ID: 0001
Revises:
Create Date: 2025-11-29

Written by hand to match geofl.storage.models at the time; it imports nothing from geofl
(vocabularies in the CHECK constraints are spelled out) so that it keeps its meaning when
the models change. Names are final (``op.f``) so that no naming convention rewrites them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _when(name: str, *, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _count(name: str, kind: type[sa.Integer] = sa.Integer, default: str = "0") -> sa.Column[object]:
    return sa.Column(name, kind(), server_default=default, nullable=False)


def _fk(column: str, table: str, target: str, ondelete: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete=ondelete
    )


def _create_runs() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("config_sha256", sa.String(64), nullable=False),
        sa.Column("rounds_planned", sa.Integer(), nullable=False),
        _count("last_committed_round"),
        sa.Column("simulated_clock", sa.Boolean(), server_default=sa.false(), nullable=False),
        _when("created_at"),
        _when("updated_at"),
        _when("finished_at", nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'completed', 'failed')", name=op.f("ck_runs_status")
        ),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
    )
    op.create_index("ix_runs_name", "runs", ["name"])


def _create_nodes() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("region", sa.String(100), nullable=True),
        sa.Column("node_config", sa.JSON(), nullable=False),
        _when("first_seen"),
        _when("last_seen"),
        sa.Column("status", sa.String(16), nullable=False),
        sa.CheckConstraint(
            "status IN ('online', 'offline', 'shutdown')", name=op.f("ck_nodes_status")
        ),
        _fk("run_id", "nodes", "runs", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
        sa.UniqueConstraint("run_id", "name", name="uq_nodes_run_id_name"),
    )


def _create_checkpoints() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("path", sa.String(500), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("num_tensors", sa.Integer(), nullable=False),
        _when("created_at"),
        _fk("run_id", "checkpoints", "runs", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_checkpoints"),
    )
    op.create_index("ix_checkpoints_run_id_round", "checkpoints", ["run_id", "round"])


def _create_rounds() -> None:
    op.create_table(
        "rounds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        _when("started_at"),
        _when("finished_at", nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("cohort_target", sa.Integer(), nullable=False),
        _count("num_selected"),
        _count("num_succeeded"),
        _count("num_failed"),
        _count("bytes_up", sa.BigInteger),
        _count("bytes_down", sa.BigInteger),
        sa.Column("train_loss", sa.Float(), nullable=True),
        sa.Column("fit_metrics", sa.JSON(), nullable=False),
        sa.Column("eval_loss", sa.Float(), nullable=True),
        sa.Column("eval_metrics", sa.JSON(), nullable=False),
        sa.Column("server_eval_loss", sa.Float(), nullable=True),
        sa.Column("server_eval_metrics", sa.JSON(), nullable=False),
        sa.Column("phase_durations", sa.JSON(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'committed', 'failed', 'aborted')", name=op.f("ck_rounds_status")
        ),
        sa.CheckConstraint(
            "phase IN ('select', 'broadcast', 'fit', 'aggregate', 'evaluate', 'commit')",
            name=op.f("ck_rounds_phase"),
        ),
        _fk("run_id", "rounds", "runs", "CASCADE"),
        _fk("checkpoint_id", "rounds", "checkpoints", "SET NULL"),
        sa.PrimaryKeyConstraint("id", name="pk_rounds"),
        sa.UniqueConstraint("run_id", "number", name="uq_rounds_run_id_number"),
    )


def _create_participations() -> None:
    op.create_table(
        "participations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        _count("attempt", default="1"),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        _count("num_examples"),
        _count("bytes_up", sa.BigInteger),
        _count("bytes_down", sa.BigInteger),
        sa.Column("compute_s", sa.Float(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=False),
        _when("started_at"),
        _when("finished_at", nullable=True),
        sa.CheckConstraint("kind IN ('fit', 'evaluate')", name=op.f("ck_participations_kind")),
        sa.CheckConstraint(
            "status IN ('ok', 'failed', 'rejected', 'late', 'dropped')",
            name=op.f("ck_participations_status"),
        ),
        _fk("round_id", "participations", "rounds", "CASCADE"),
        _fk("node_id", "participations", "nodes", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_participations"),
        sa.UniqueConstraint(
            "round_id", "task_id", "attempt", name="uq_participations_round_id_task_id_attempt"
        ),
    )
    op.create_index("ix_participations_node_id", "participations", ["node_id"])


def _create_events() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("round", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        _when("created_at"),
        _fk("run_id", "events", "runs", "CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
    )
    op.create_index("ix_events_run_id", "events", ["run_id"])


def upgrade() -> None:
    """Create every table, parents first."""
    _create_runs()
    _create_nodes()
    _create_checkpoints()
    _create_rounds()
    _create_participations()
    _create_events()


def downgrade() -> None:
    """Drop every table, children first."""
    op.drop_index("ix_events_run_id", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_participations_node_id", table_name="participations")
    op.drop_table("participations")
    op.drop_table("rounds")
    op.drop_index("ix_checkpoints_run_id_round", table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_table("nodes")
    op.drop_index("ix_runs_name", table_name="runs")
    op.drop_table("runs")
