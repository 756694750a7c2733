"""metric rollups: min/max/last per block of 16, 256, 4096 and 65536 steps

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "metric_rollups",
        # key order = the chart query's access path: one run, name and tier, a range of blocks, all ranks
        sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("tier", sa.Integer, primary_key=True),
        sa.Column("bucket", sa.Integer, primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("vmin", sa.Double, nullable=False),
        sa.Column("vmax", sa.Double, nullable=False),
        sa.Column("last_step", sa.Integer, nullable=False),
        sa.Column("last_value", sa.Double, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("metric_rollups")
