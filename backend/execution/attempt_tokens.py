"""Tokens of one run's attempt: handed out at each claim (node 0's and every other node's of a gang) and to each Slurm
job, presented by the worker for everything it does to that attempt and by its metrics shipper. Only the SHA-256 is
stored. A token acts for its run only, and only while its attempt is the run's live one (a Slurm job's: while the run
is under that job, which Slurm may requeue as the next attempt), and up to ULAB_INGEST_AFTER_END_S after it ended, so
the worker can drain its last metrics and the tracker forwarder read them."""
from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import DateTime, ForeignKey, Integer, String, func, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from backend.auth.roles import Role
from backend.auth.service import Principal, hash_token, new_token
from backend.core.db import Base
from backend.core.settings import get_settings
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import TERMINAL, RunState

PREFIX = "ulab_attempt_"


class AttemptToken(Base):
    __tablename__ = "attempt_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer, default=0)
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a Slurm job's token, once submitted
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


def mint(session: Session, run_id: int, attempt: int, node_rank: int = 0) -> str:
    """A new token of the run's attempt (for node `node_rank`), added to the caller's session."""
    token, digest = new_token(PREFIX)
    session.add(AttemptToken(run_id=run_id, attempt=attempt, node_rank=node_rank, token_hash=digest))
    return token


def bind_job(session: Session, token: str, job_id: str) -> None:
    """The Slurm job that holds `token` (its attempt's): the token follows the job through Slurm's requeues."""
    session.execute(update(AttemptToken).where(AttemptToken.token_hash == hash_token(token)).values(job_id=job_id))


def holds(row: AttemptToken, run: Run) -> bool:
    """Whether the token still acts for the run: its attempt (or its Slurm job) is the run's live one, and the run
    has not ended, or ended at most ULAB_INGEST_AFTER_END_S ago."""
    if run.attempt != row.attempt and (row.job_id is None or run.slurm_job_id != row.job_id):
        return False
    if RunState(run.state) not in TERMINAL:
        return True
    late = timedelta(seconds=get_settings().ingest_after_end_s)
    return run.finished_at is not None and transitions.now() - transitions.as_utc(run.finished_at) <= late


def verify(session: Session, token: str) -> Principal | None:
    """The principal of a live attempt token: role worker, scoped to its run, attempt and node; None otherwise."""
    if not token.startswith(PREFIX):
        return None
    row = session.scalar(select(AttemptToken).where(AttemptToken.token_hash == hash_token(token)))
    run = session.get(Run, row.run_id) if row is not None else None
    if row is None or run is None or not holds(row, run):
        return None
    return Principal(None, f"run {run.id} attempt {run.attempt} node {row.node_rank}", Role.WORKER,
                     run_id=run.id, attempt=run.attempt, node_rank=row.node_rank, job_id=row.job_id)
