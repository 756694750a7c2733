"""Attempts of a run: each start by a worker is one attempt; a retry resumes the same run from its last
checkpoint as the next attempt. The history is kept in run_attempts (`transitions.record_attempt` writes a
row when an attempt ends)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class RunAttempt(Base):
    __tablename__ = "run_attempts"
    __table_args__ = (UniqueConstraint("run_id", "attempt", name="uq_run_attempts_run_attempt"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(32))
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    exit_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    queued_by: Mapped[int | None] = mapped_column(Integer, nullable=True)  # api_tokens.id; null: reaper or Slurm
    # the effective plan this attempt ran (a resume may change the run section): Compare diffs attempts by it
    spec: Mapped[dict | None] = mapped_column(JSON, nullable=True)

