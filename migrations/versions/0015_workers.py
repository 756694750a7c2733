"""workers: what each worker reported it can run at its start (library versions, attention kernels, GPU model)


Revision ID: 0015
Revises: 0011
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("queues", sa.JSON, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("gpu_model", sa.String(200), nullable=True),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("versions", sa.JSON, nullable=False),
        sa.Column("attn_implementations", sa.JSON, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("workers")
