from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from backend.core.db import Base
from backend.runs.attempts import RunAttempt
from backend.runs.states import RunState


class Run(Base):
    """One training job: its spec (plan + run section), the predicted estimate and its lifecycle."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_state", "state"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id"), nullable=True)
    state: Mapped[str] = mapped_column(String(32), default=RunState.PENDING_APPROVAL.value)
    spec: Mapped[dict] = mapped_column(JSON)
    estimate: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    max_retries: Mapped[int] = mapped_column(Integer, default=0)  # automatic retries after `lost`
    priority: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)
    run_dir: Mapped[str | None] = mapped_column(Text, nullable=True)
    submitted_by: Mapped[int | None] = mapped_column(Integer, nullable=True)  # api_tokens.id
    approved_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    forced: Mapped[bool] = mapped_column(Boolean, default=False)  # approved although the estimate did not fit
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    exit_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    approved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)

    attempts: Mapped[list[RunAttempt]] = relationship(order_by=RunAttempt.attempt, lazy="selectin",
                                                      cascade="all, delete-orphan")
