"""Pydantic shapes of runs: the trainer-v1 `run` section on submit, and the run as the API answers it."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from backend.core.text import NoControlChars


class DataSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    path: str = Field(min_length=1, max_length=4096, examples=["data/tiny.txt"])


class Stage(BaseModel):
    model_config = ConfigDict(extra="allow")
    seq_len: int = Field(ge=1, le=1 << 30)
    steps: int = Field(ge=1, le=10_000_000)


class RunSection(BaseModel):
    """The `run` section of trainer-v1: what the trainer reads besides the plan."""

    model_config = ConfigDict(extra="allow")
    steps: int = Field(20, ge=1, le=10_000_000)
    learning_rate: float = Field(1e-3, gt=0, le=10)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    data: DataSpec
    model_path: str | None = Field(None, max_length=4096)
    checkpoint_every: int = Field(100, ge=1, le=10_000_000)
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    stages: list[Stage] | None = Field(None, max_length=64)

    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages) if self.stages else self.steps


class RunCreate(BaseModel):
    plan_id: int = Field(ge=1, le=2**31 - 1)
    name: Annotated[str, NoControlChars] = Field("", max_length=200)
    priority: int = Field(0, ge=0, le=9)
    max_retries: int = Field(0, ge=0, le=10, description="Automatic resumed attempts after the run is lost.")
    run: RunSection


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    attempt: int
    state: str
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    last_step: int
    exit_reason: str | None


class RunOut(BaseModel):
    id: int
    name: str
    state: str
    plan_id: int | None
    spec: dict[str, Any]
    estimate: dict[str, Any] | None
    worker: str | None
    attempt: int
    max_retries: int = 0
    attempts: list[AttemptOut] = []
    priority: int
    cancel_requested: bool
    submitted_by: int | None = None
    approved_by: int | None = None
    forced: bool = False
    created_at: datetime
    approved_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    exit_reason: str | None
    last_step: int
    steps: int

    model_config = ConfigDict(from_attributes=True)


class LogOut(BaseModel):
    lines: list[str]
