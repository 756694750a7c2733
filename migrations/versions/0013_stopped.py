"""Runs stopped by a rule end `stopped` (runs.stopped_by: the alert kind that asked); alerts are per attempt
(run_alerts.attempt, unique per run, attempt and kind: the rules re-arm on every attempt); the divergence rule's
per-attempt reference (runs.attempt_loss_first_step, runs.attempt_loss_min); what a resume changed (runs.changes)

Revision ID: 0013
Revises: 0011
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0014"  # chained at merge: 0011 -> 0012 -> 0015 -> 0014 -> 0013
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("stopped_by", sa.String(32), nullable=True))
    op.add_column("runs", sa.Column("attempt_loss_first_step", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("attempt_loss_min", sa.Double(), nullable=True))
    op.add_column("runs", sa.Column("changes", sa.JSON(), nullable=True))
    with op.batch_alter_table("run_alerts") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        batch.drop_constraint("uq_run_alerts_run_kind", type_="unique")
        batch.create_unique_constraint("uq_run_alerts_run_attempt_kind", ["run_id", "attempt", "kind"])


def downgrade() -> None:
    with op.batch_alter_table("run_alerts") as batch:
        batch.drop_constraint("uq_run_alerts_run_attempt_kind", type_="unique")
        batch.create_unique_constraint("uq_run_alerts_run_kind", ["run_id", "kind"])
        batch.drop_column("attempt")
    op.drop_column("runs", "changes")
    op.drop_column("runs", "attempt_loss_min")
    op.drop_column("runs", "attempt_loss_first_step")
    op.drop_column("runs", "stopped_by")
