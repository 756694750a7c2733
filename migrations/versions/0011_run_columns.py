"""runs.last_step_at: when a step's loss last arrived, the clock of the `stalled` alert; runs.resume_from: the
checkpoint a retry resumes from ("resume from here"); runs.idempotency_fingerprint: the digest of the
submit an Idempotency-Key was used with

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("last_step_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("runs", sa.Column("resume_from", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("idempotency_fingerprint", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "idempotency_fingerprint")
    op.drop_column("runs", "resume_from")
    op.drop_column("runs", "last_step_at")
