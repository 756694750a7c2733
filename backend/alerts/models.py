"""Alerts of a run (run_alerts): raised at metric ingest by backend/alerts/service.py, one per kind and attempt (the
rules re-arm on every attempt)."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, Text, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class RunAlert(Base):
    __tablename__ = "run_alerts"
    __table_args__ = (UniqueConstraint("run_id", "attempt", "kind", name="uq_run_alerts_run_attempt_kind"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    kind: Mapped[str] = mapped_column(String(32))
    step: Mapped[int] = mapped_column(Integer)
    message: Mapped[str] = mapped_column(Text)
    stopped: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
