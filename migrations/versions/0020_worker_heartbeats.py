"""workers.heartbeat_at: a running worker writes it every few seconds; GET /api/workers calls a worker whose heartbeat
is older than ULAB_WORKER_LOST_AFTER_S `lost`, and approval no longer counts its kernels

Revision ID: 0020
Revises: 0013
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("workers", "heartbeat_at")
