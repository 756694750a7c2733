from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Integer, String, func
from sqlalchemy.orm import Mapped, mapped_column

from backend.core.db import Base


class ApiToken(Base):
    """An API token. Only its SHA-256 is stored; the token itself is shown once, when created."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(32))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # A worker token's queues, comma-separated (backend/core/queue.queue_for): it claims runs of these only
    queues: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    # A browser session's token: minted at sign-in for the token signed in with (this id), revoked at sign-out
    session_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
