"""calibration_points: predicted vs measured memory and tokens/s of finished runs and gpu-check rows

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

FIGURES = ("peak_allocated_gib", "reserved_gib", "device_total_gib", "tokens_per_s")


def upgrade() -> None:
    op.create_table(
        "calibration_points",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("source_ref", sa.String(400), nullable=False),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="SET NULL"), nullable=True),
        sa.Column("gpu", sa.String(100), nullable=False),
        sa.Column("features", sa.String(400), nullable=False),
        sa.Column("world", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("plan", sa.JSON(), nullable=False),
        *[sa.Column(f"{kind}_{name}", sa.Double(), nullable=True) for name in FIGURES
          for kind in ("predicted", "measured")],
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("source", "source_ref", name="uq_calibration_source_ref"),
    )


def downgrade() -> None:
    op.drop_table("calibration_points")
