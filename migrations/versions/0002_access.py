"""API tokens; who submitted a run and who forced its approval

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("submitted_by", sa.Integer, nullable=True))
        batch.add_column(sa.Column("approved_by", sa.Integer, nullable=True))
        batch.add_column(sa.Column("forced", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("forced")
        batch.drop_column("approved_by")
        batch.drop_column("submitted_by")
    op.drop_table("api_tokens")
