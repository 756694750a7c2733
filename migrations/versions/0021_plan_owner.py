"""plans.created_by: the token that stored the plan (null for plans stored before owners were kept); a probe of
the plan is its owner's or an approver's to queue (backend/probes/service.py)

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""
import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("plans", sa.Column("created_by", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("plans", "created_by")
