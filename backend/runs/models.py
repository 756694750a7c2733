from __future__ import annotations

import copy
from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Double, ForeignKey, Index, Integer, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column, relationship

from backend.alerts.models import RunAlert
from backend.core.db import Base
from backend.plans import models as _plans  # noqa: F401  (runs.plan_id refers to it: a run cannot be written without)
from backend.runs.attempts import RunAttempt
from backend.runs.states import RunState
from plan.model import Plan


class Run(Base):
    """One training job: its spec (plan + run section), the predicted estimate and its lifecycle."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_state", "state"),
                      Index("uq_runs_submitter_idempotency_key", "submitted_by", "idempotency_key", unique=True))

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id"), nullable=True)
    state: Mapped[str] = mapped_column(String(32), default=RunState.PENDING_APPROVAL.value)
    # the rule that asked this attempt to stop (an alert kind; transitions.request_stop): it ends `stopped`
    stopped_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    # what a resume changed ({at, attempt, message}: a new learning rate or schedule), for the timeline
    changes: Mapped[list | None] = mapped_column(JSON, nullable=True)
    # the divergence rule's reference for this attempt (backend/alerts/service.py): its first loss step and its
    # lowest loss so far; when the next attempt is queued, the lowest loss becomes the one its checkpoint carries
    # (attempt_loss_inherited, plan/guardrails.GUARD_FILE; null: none)
    attempt_loss_first_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt_loss_min: Mapped[float | None] = mapped_column(Double, nullable=True)
    attempt_loss_inherited: Mapped[float | None] = mapped_column(Double, nullable=True)
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
    device: Mapped[str | None] = mapped_column(String(16), nullable=True)  # "cuda" | "cpu", from its metrics
    final_loss: Mapped[float | None] = mapped_column(Double, nullable=True)  # loss at final_loss_step (ingest)
    final_loss_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # when the API last stored a step's loss (metric ingest): the clock of the `stalled` alert (runs/alerts.py)
    last_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # "resume from here": the checkpoint (stage<i>/checkpoint-<step>) the queued attempt resumes from; null: newest
    resume_from: Mapped[str | None] = mapped_column(String(64), nullable=True)
    tags: Mapped[list | None] = mapped_column(JSON, nullable=True)
    notes: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Who runs it (backend/executors): "celery" (a worker claims it) or "slurm" (one sbatch job). For Slurm runs:
    # the run's own partition/time limit (else the queue's settings), the job serving the live attempt, and
    # what the poller last read of it (state, pending reason, node list, how often Slurm requeued it).
    executor: Mapped[str] = mapped_column(String(16), default="celery", server_default="celery")
    slurm_partition: Mapped[str | None] = mapped_column(String(64), nullable=True)
    slurm_time_limit: Mapped[str | None] = mapped_column(String(32), nullable=True)
    slurm_job_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    slurm_state: Mapped[str | None] = mapped_column(String(32), nullable=True)
    slurm_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    slurm_nodes: Mapped[str | None] = mapped_column(Text, nullable=True)
    slurm_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # When the run last became queued, and when its message was last sent (lifecycle.resend_stale)
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Who queued the live attempt (api_tokens.id: the approver for attempt 1, whoever retried it after; null: the
    # reaper or Slurm requeued it), kept in run_attempts with the attempt's outcome
    queued_by: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The first step of the live attempt's metrics file, as its shipper reports it: steps before it are the resumed
    # checkpoint's, stored by earlier attempts (transitions.missing_steps); null: not reported yet
    attempt_first_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The worker token that claimed the live attempt (api_tokens.id): only it may write the run's metrics
    claimed_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The submit's Idempotency-Key header: the same key from the same token answers this run again
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # sha256 of that submit's body (service.body_fingerprint): the key with another body is refused, not answered
    idempotency_fingerprint: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # "train", or "probe": the plan at reduced depth, measured and extrapolated (worker/probe.py)
    kind: Mapped[str] = mapped_column(String(16), default="train", server_default="train")
    probe_request: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # {"depths", "steps"} of a probe

    attempts: Mapped[list[RunAttempt]] = relationship(order_by=RunAttempt.attempt, lazy="selectin",
                                                      cascade="all, delete-orphan")
    alerts: Mapped[list[RunAlert]] = relationship(order_by=RunAlert.id, lazy="selectin", cascade="all, delete-orphan")

    @property
    def open_alerts(self) -> list[RunAlert]:
        """The alerts of the run's last attempt that did not stop it: a run that ends with one is not plain
        "succeeded", and every page shows them beside its state."""
        return [a for a in self.alerts if a.attempt == self.attempt and not a.stopped]

    @property
    def plan(self) -> Plan:
        """The stored plan (`spec`: the plan with its run section), validated by the plan model: what every reader of
        a run's plan reads. Validated once and kept until the spec changes (a resolved checkpoint, a changed run
        section)."""
        kept = self.__dict__.get("_validated_plan")
        if kept is None or kept[0] != self.spec:
            kept = (copy.deepcopy(self.spec), Plan.model_validate(self.spec))
            self.__dict__["_validated_plan"] = kept
        return kept[1]
