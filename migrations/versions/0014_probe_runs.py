"""runs.kind: "train", or "probe" (a short run of the plan at reduced depth), and a probe's depths and
steps (runs.probe_request); plans.probe: the plan's
latest probe result (plan/probe.py's JSON, with the run that measured it)

Revision ID: 0014
Revises: 0011
Create Date: 2026-11-25
"""
import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0015"  # the lead re-chains migrations at merge
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("kind", sa.String(16), nullable=False, server_default="train"))
    op.add_column("runs", sa.Column("probe_request", sa.JSON(), nullable=True))
    op.add_column("plans", sa.Column("probe", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "probe_request")
    op.drop_column("plans", "probe")
    op.drop_column("runs", "kind")
