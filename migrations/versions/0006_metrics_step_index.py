"""metrics: unique key ordered (run, name, step, rank), with the value included on PostgreSQL, so a chart's
step range is one index range scan over all ranks and min/max step are index end points

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("uq_metrics_run_name_step_rank", "metrics", ["run_id", "name", "step", "rank"], unique=True,
                    postgresql_include=["value"])
    with op.batch_alter_table("metrics") as batch:
        batch.drop_constraint("uq_metrics_run_name_rank_step", type_="unique")


def downgrade() -> None:
    with op.batch_alter_table("metrics") as batch:
        batch.create_unique_constraint("uq_metrics_run_name_rank_step", ["run_id", "name", "rank", "step"])
    op.drop_index("uq_metrics_run_name_step_rank", "metrics")
