"""run_alerts: NaN/Inf and divergence alerts raised at metric ingest; runs.device

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-24
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # what a run's ranks ran on, from its first metric point ("cuda" or "cpu"; null until then)
    op.add_column("runs", sa.Column("device", sa.String(16), nullable=True))
    # the loss at the highest step seen so far (the runs list's final-loss column), kept at ingest
    op.add_column("runs", sa.Column("final_loss", sa.Double(), nullable=True))
    op.add_column("runs", sa.Column("final_loss_step", sa.Integer(), nullable=True))
    # a person's tags (a JSON list of short strings) and notes on a run
    op.add_column("runs", sa.Column("tags", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("notes", sa.Text(), nullable=True))
    op.create_table(
        "run_alerts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.UniqueConstraint("run_id", "kind", name="uq_run_alerts_run_kind"),
    )


def downgrade() -> None:
    op.drop_table("run_alerts")
    for column in ("device", "final_loss", "final_loss_step", "tags", "notes"):
        op.drop_column("runs", column)
