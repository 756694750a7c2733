from __future__ import annotations

from sqlalchemy import BigInteger, Double, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class MetricPoint(Base):
    """One narrow row per (run, rank, step, name). The unique key doubles as the chart query's index."""

    __tablename__ = "metrics"
    # Unique key and the chart's index: step before rank, so a step range is one index range over all ranks;
    # on PostgreSQL it carries the value too (index-only scans).
    __table_args__ = (Index("uq_metrics_run_name_step_rank", "run_id", "name", "step", "rank", unique=True,
                            postgresql_include=["value"]),)

    # BigInteger on PostgreSQL, INTEGER (the rowid) on SQLite; also the cursor of the live stream.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Double)
    wall_time: Mapped[float] = mapped_column(Double)
    # the run's attempt that stored it (null: stored before this was kept); a resend by an older attempt never
    # overwrites a newer one's value, and "every step stored" counts the live attempt's (transitions.missing_steps)
    attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)


class MetricRollup(Base):
    """Min, max and last value of one metric over a block of `tier` steps (tiers 16, 256, 4096, 65536),
    kept up to date at ingest, so a chart over a million steps reads thousands of rows, not a million."""

    __tablename__ = "metric_rollups"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    tier: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)  # steps [bucket*tier, (bucket+1)*tier)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    vmin: Mapped[float] = mapped_column(Double)
    vmax: Mapped[float] = mapped_column(Double)
    last_step: Mapped[int] = mapped_column(Integer)
    last_value: Mapped[float] = mapped_column(Double)
