"""Pydantic shapes of runs: a submit (a stored plan plus the trainer-v1 `run` section), and the run as the API
answers it."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from backend.core.text import NoControlChars
from backend.runs.states import RunState
from plan.model import LrScheduler, RunSection
from plan.results import Estimate


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan_id: int | None = Field(None, ge=1, le=2**31 - 1, description="A stored plan (or give `plan`)")
    plan: dict[str, Any] | None = Field(None, description="The plan itself, stored only when the run is created "
                                                          "(a refused submit stores nothing)")
    name: Annotated[str, NoControlChars] = Field("", max_length=200)
    priority: int = Field(0, ge=0, le=9)
    max_retries: int = Field(0, ge=0, le=10, description="Automatic resumed attempts after the run is lost.")
    run: RunSection = Field(description="The trainer-v1 run section (plan/model.py RunSection)")
    # Only for a GPU queue that runs on Slurm (backend/executors/slurm/jobscript.py has the same patterns).
    slurm_partition: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$",
                                        description="Slurm partition for this run instead of the queue's.")
    slurm_time_limit: str | None = Field(
        None, pattern=r"^(\d{1,5}|\d{1,5}:\d{1,2}|\d{1,5}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2})$",
        description="Slurm time limit (minutes, H:M:S or D-H:M:S) for this run instead of the queue's.")


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    attempt: int
    state: RunState
    worker: str | None
    started_at: datetime | None
    finished_at: datetime | None
    last_step: int
    exit_reason: str | None
    queued_by: int | None = None  # api_tokens.id of who queued this attempt; null: the reaper or Slurm requeued it
    spec: dict[str, Any] | None = Field(None, description="The effective plan this attempt ran (a resume may change "
                                                          "its run section)")


class AlertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    attempt: int = Field(1, description="The attempt that raised it: the rules re-arm on every attempt")
    kind: str
    step: int
    message: str
    stopped: bool
    created_at: datetime


class EventOut(BaseModel):
    """One entry of a run's timeline (GET /api/runs/{id}/events)."""
    at: datetime
    kind: str = Field(description="submitted | approved | attempt_started | attempt_ended | alert | changed")
    attempt: int | None = None
    step: int | None = None
    state: str | None = Field(None, description="attempt_ended: how the attempt ended")
    message: str = ""
    stopped: bool = Field(False, description="alert: the rule stopped the run")


class RunOut(BaseModel):
    id: int
    name: str
    state: RunState
    plan_id: int | None
    spec: dict[str, Any]
    estimate: Estimate | None
    worker: str | None
    attempt: int
    max_retries: int = 0
    attempts: list[AttemptOut] = []
    alerts: list[AlertOut] = []
    open_alerts: list[AlertOut] = Field([], description="Alerts of the last attempt that did not stop it: shown "
                                                        "beside the state (a run that ends with one is not plain "
                                                        "succeeded)")
    device: str | None = Field(None, description='What the ranks ran on: "cuda" or "cpu" (null before the first '
                                                 'step)')
    priority: int
    cancel_requested: bool
    submitted_by: int | None = None
    approved_by: int | None = None
    forced: bool = False
    queued_by: int | None = None  # who queued the live attempt (the approver, or who retried it; null: the reaper)
    created_at: datetime
    approved_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    exit_reason: str | None
    last_step: int
    steps: int
    final_loss: float | None = Field(None, description="The loss at the highest step reported so far")
    resume_from: str | None = Field(None, description="The checkpoint the queued or live attempt resumed from "
                                                      "(\"resume from here\"); null: the newest")
    tags: list[str] = []
    notes: str = ""
    kind: str = Field("train", description='"train", or "probe": the plan at reduced depth, measured')

    @field_validator("tags", mode="before")
    @classmethod
    def _no_tags(cls, v: Any) -> Any:
        return v or []

    @field_validator("notes", mode="before")
    @classmethod
    def _no_notes(cls, v: Any) -> Any:
        return v or ""
    # backend/executors: "celery" or "slurm"; for Slurm, the job of the live attempt and what Slurm last said.
    executor: str = "celery"
    slurm_job_id: str | None = None
    slurm_state: str | None = None
    slurm_reason: str | None = None
    slurm_nodes: str | None = None
    slurm_partition: str | None = None
    slurm_time_limit: str | None = None

    model_config = ConfigDict(from_attributes=True)


Tag = Annotated[str, NoControlChars, StringConstraints(min_length=1, max_length=40, strip_whitespace=True)]


class RunLabels(BaseModel):
    """What a person may write on a run at any time: tags (filterable in the runs list) and notes."""

    model_config = ConfigDict(extra="forbid")
    tags: list[Tag] | None = Field(None, max_length=20)
    notes: Annotated[str, Field(max_length=10_000)] | None = None


class RetryIn(BaseModel):
    """POST /api/runs/{id}/retry: without a body the next attempt resumes from the newest checkpoint."""

    model_config = ConfigDict(extra="forbid")
    from_checkpoint: str | None = Field(None, max_length=64, examples=["stage0/checkpoint-100"],
                                        description="Resume from this checkpoint (stage/checkpoint-step, as listed by "
                                                    "GET /api/runs/{id}/checkpoints); newer ones are moved aside")
    learning_rate: float | None = Field(None, gt=0, le=10, description="The next attempt trains at this learning "
                                                                       "rate (recorded on the run's timeline)")
    lr_scheduler: LrScheduler | None = Field(None, description="The next attempt's learning-rate schedule")


class CheckpointOut(BaseModel):
    name: str = Field(description="<stage>-checkpoint-<step>: GET /api/runs/{id}/checkpoints/{name} downloads it")
    stage: str
    step: int
    bytes: int
    saved_at: datetime
    complete: bool = Field(True, description="trainer_state.json written: a retry can resume from it")
    loss: float | None = Field(None, description="The loss of the step that saved it (null: not recorded)")
    diverged: bool = Field(False, description="Its step's loss was above the divergence rule's bounds (a stop's "
                                              "checkpoint); those from before the divergence are listed first")


class LogOut(BaseModel):
    lines: list[str]
    ranks: int = Field(1, description="the run's ranks: `rank` takes 0 .. ranks-1")


class ShareIn(BaseModel):
    """POST /api/runs/{id}/share: how long the link opens the run."""

    model_config = ConfigDict(extra="forbid")
    days: int = Field(30, ge=1, le=365, description="The link opens the run for this many days")


class ShareListed(BaseModel):
    """A live share link of a run (the token itself is not kept: only its start, to tell links apart)."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    prefix: str
    created_by: int | None
    created_at: datetime
    expires_at: datetime


class ShareOut(ShareListed):
    """A new share link: `url` opens the run's page read-only, for anyone who has it, signed in or not; `token` is
    shown this once (only its SHA-256 is stored)."""

    url: str
    token: str


class SharesRevoked(BaseModel):
    revoked: int = Field(description="How many live share links of the run were revoked")
