from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Double, ForeignKey, Integer, String, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class CalibrationPoint(Base):
    """One measured run next to the planner's prediction for its plan: a finished run of this service
    (source "run") or a row of a `make gpu-check` results file (source "gpu-check")."""

    __tablename__ = "calibration_points"
    __table_args__ = (UniqueConstraint("source", "source_ref", name="uq_calibration_source_ref"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(String(32))
    source_ref: Mapped[str] = mapped_column(String(400))      # "run 12 attempt 1", "gpu-h100.csv:3"
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), nullable=True)
    gpu: Mapped[str] = mapped_column(String(100))
    features: Mapped[str] = mapped_column(String(400))
    world: Mapped[int] = mapped_column(Integer)
    seq_len: Mapped[int] = mapped_column(Integer)
    plan: Mapped[dict] = mapped_column(JSON)
    predicted_peak_allocated_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    measured_peak_allocated_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_reserved_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    measured_reserved_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_device_total_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    measured_device_total_gib: Mapped[float | None] = mapped_column(Double, nullable=True)
    predicted_tokens_per_s: Mapped[float | None] = mapped_column(Double, nullable=True)
    measured_tokens_per_s: Mapped[float | None] = mapped_column(Double, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
