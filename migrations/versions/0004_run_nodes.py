"""nodes of multi-node runs (gang of node tasks meeting at a c10d rendezvous)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_nodes",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("node_rank", sa.Integer, nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("rdzv_endpoint", sa.String(300), nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("run_id", "attempt", "node_rank", name="uq_run_nodes_run_attempt_rank"),
    )


def downgrade() -> None:
    op.drop_table("run_nodes")
