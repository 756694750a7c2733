from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class Plan(Base):
    """A training configuration (plan-v1) and the planner's estimate for it, as stored when created."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    spec: Mapped[dict] = mapped_column(JSON)
    estimate: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # the latest probe of this plan (plan/probe.py's result, with "run_id"): measured beside predicted
    probe: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # the api_tokens.id that stored it (null: stored before owners were kept); its probes are its owner's to queue
    created_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
