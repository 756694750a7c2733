"""The nodes of a multi-node run: one row per (run, attempt, node rank), claimed by the worker that runs that
node. Node 0 publishes the rendezvous endpoint; the other nodes wait for it (a gang of node tasks)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class RunNode(Base):
    __tablename__ = "run_nodes"
    __table_args__ = (UniqueConstraint("run_id", "attempt", "node_rank", name="uq_run_nodes_run_attempt_rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str] = mapped_column(String(200))
    rdzv_endpoint: Mapped[str | None] = mapped_column(String(300), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    claimed_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the node worker's token
