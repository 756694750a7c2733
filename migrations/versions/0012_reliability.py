"""metrics.attempt: the attempt that stored a point (a resend never overwrites a newer attempt's value;
completeness counts the live attempt's); runs.attempt_first_step: where the live attempt's metrics begin;
runs.queued_by and run_attempts.queued_by: who queued each attempt

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("metrics", sa.Column("attempt", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("attempt_first_step", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("queued_by", sa.Integer(), nullable=True))
    op.add_column("run_attempts", sa.Column("queued_by", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("run_attempts", "queued_by")
    op.drop_column("runs", "queued_by")
    op.drop_column("runs", "attempt_first_step")
    op.drop_column("metrics", "attempt")
