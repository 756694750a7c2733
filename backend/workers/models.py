"""A worker's report of what it can run: library versions, attention kernels and GPU, sent when it starts."""
from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)  # the Celery node name (celery@host)
    queues: Mapped[list] = mapped_column(JSON, default=list)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    stopped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # written every worker_heartbeat_s while the worker process lives (worker/celery_app.py); a worker killed
    # without its shutdown report stops writing it, and is `lost` once it is older than worker_lost_after_s
    heartbeat_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    gpu_model: Mapped[str | None] = mapped_column(String(200), nullable=True)  # None: CPU ranks
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    # torch, cuda, deepspeed, transformers, accelerate, flash_attn, flash_attn_3, liger_kernel: version or None
    versions: Mapped[dict] = mapped_column(JSON, default=dict)
    attn_implementations: Mapped[list] = mapped_column(JSON, default=list)  # what this worker's ranks can run
