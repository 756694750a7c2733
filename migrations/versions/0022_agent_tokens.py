"""Workers reach the service over HTTP only: a worker token names the queues it serves (api_tokens.queues), and each
claim hands out a token of the claimed attempt (attempt_tokens; only its SHA-256 is stored).

Revision ID: 0022
Revises: 0021
"""
import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("queues", sa.String(2000), nullable=True))
    op.create_table(
        "attempt_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("run_id", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_attempt_tokens_run_id", "attempt_tokens", ["run_id"])


def downgrade() -> None:
    op.drop_index("ix_attempt_tokens_run_id", "attempt_tokens")
    op.drop_table("attempt_tokens")
    op.drop_column("api_tokens", "queues")
