"""Hardening: when a queued run was queued and last sent (re-send of runs a flushed broker lost), the token
that claimed a run or node (metric writes scoped to it), session tokens (sign-out revokes them), and a submit's
Idempotency-Key (a repeated submit answers the run it made); and a repair of text stored before the UTF-8 check (a
lone surrogate, which made every list that read its row fail, becomes "?")

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""
import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


# The tables and columns a user's text reaches (names, plans, reasons); JSON columns are repaired value by value.
TEXT_COLUMNS = {"plans": (("name", False), ("spec", True), ("estimate", True)),
                "runs": (("name", False), ("spec", True), ("estimate", True), ("exit_reason", False))}


def _utf8(text: str) -> str:
    return text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes "?"


def _repaired(value):
    if isinstance(value, str):
        return _utf8(value)
    if isinstance(value, list):
        return [_repaired(v) for v in value]
    if isinstance(value, dict):
        return {_utf8(k): _repaired(v) for k, v in value.items()}
    return value


def repair_text() -> None:
    """Rows stored before backend/core/text.py checked them: rewrite the ones holding a lone surrogate."""
    bind = op.get_bind()
    for table, columns in TEXT_COLUMNS.items():
        t = sa.table(table, sa.column("id"), *[sa.column(c, sa.JSON() if is_json else sa.Text())
                                               for c, is_json in columns])
        for row in bind.execute(sa.select(t)).mappings():
            changes = {column: _repaired(row[column]) for column, _ in columns if _has_surrogate(row[column])}
            if changes:
                bind.execute(t.update().where(t.c.id == row["id"]).values(**changes))


def _has_surrogate(value) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def upgrade() -> None:
    repair_text()
    with op.batch_alter_table("runs") as t:
        t.add_column(sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
        t.add_column(sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True))
        t.add_column(sa.Column("claimed_token_id", sa.Integer(), nullable=True))
        t.add_column(sa.Column("idempotency_key", sa.String(200), nullable=True))
        t.create_index("uq_runs_submitter_idempotency_key", ["submitted_by", "idempotency_key"], unique=True)
    with op.batch_alter_table("run_nodes") as t:
        t.add_column(sa.Column("claimed_token_id", sa.Integer(), nullable=True))
    with op.batch_alter_table("api_tokens") as t:
        t.add_column(sa.Column("session_of", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as t:
        t.drop_column("session_of")
    with op.batch_alter_table("run_nodes") as t:
        t.drop_column("claimed_token_id")
    with op.batch_alter_table("runs") as t:
        t.drop_index("uq_runs_submitter_idempotency_key")
        t.drop_column("idempotency_key")
        t.drop_column("claimed_token_id")
        t.drop_column("sent_at")
        t.drop_column("queued_at")
