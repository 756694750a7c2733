"""run attempts (retry resumes a run as its next attempt) and a retry budget per run

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_attempts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_step", sa.Integer, nullable=False, server_default="0"),
        sa.Column("exit_reason", sa.Text, nullable=True),
        sa.UniqueConstraint("run_id", "attempt", name="uq_run_attempts_run_attempt"),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("max_retries", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("max_retries")
    op.drop_table("run_attempts")
