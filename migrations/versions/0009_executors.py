"""runs: executor and Slurm job columns

Revision ID: 0009
Revises: 0007
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = (
    ("executor", sa.String(16), "celery"),
    ("slurm_partition", sa.String(64), None),
    ("slurm_time_limit", sa.String(32), None),
    ("slurm_job_id", sa.String(32), None),
    ("slurm_state", sa.String(32), None),
    ("slurm_reason", sa.Text(), None),
    ("slurm_nodes", sa.Text(), None),
)


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        for name, kind, default in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=default is None,
                                       server_default=default))
        batch.add_column(sa.Column("slurm_restarts", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_runs_slurm_job_id", "runs", ["slurm_job_id"])


def downgrade() -> None:
    op.drop_index("ix_runs_slurm_job_id", table_name="runs")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("slurm_restarts")
        for name, _, _ in reversed(COLUMNS):
            batch.drop_column(name)
