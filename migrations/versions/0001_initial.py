"""plans, runs and metrics

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("estimate", sa.JSON, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("plan_id", sa.Integer, sa.ForeignKey("plans.id"), nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("estimate", sa.JSON, nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("run_dir", sa.Text, nullable=True),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("exit_reason", sa.Text, nullable=True),
        sa.Column("last_step", sa.Integer, nullable=False, server_default="0"),
        sa.Column("steps", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.Column("approved_at", TS, nullable=True),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.Column("heartbeat_at", TS, nullable=True),
    )
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_table(
        "metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.Double, nullable=False),
        sa.Column("wall_time", sa.Double, nullable=False),
        sa.UniqueConstraint("run_id", "name", "rank", "step", name="uq_metrics_run_name_rank_step"),
    )


def downgrade() -> None:
    op.drop_table("metrics")
    op.drop_index("ix_runs_state", "runs")
    op.drop_table("runs")
    op.drop_table("plans")
