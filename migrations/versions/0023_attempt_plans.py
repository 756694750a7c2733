"""run_attempts.spec: the effective plan each attempt ran (a resume may change the learning rate or schedule), so
Compare diffs attempts; runs.attempt_loss_inherited: the divergence reference a resumed attempt took from its
checkpoint (plan/guardrails.py)

Revision ID: 0023
Revises: 0022
"""
import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("run_attempts", sa.Column("spec", sa.JSON(), nullable=True))
    op.add_column("runs", sa.Column("attempt_loss_inherited", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "attempt_loss_inherited")
    op.drop_column("run_attempts", "spec")
