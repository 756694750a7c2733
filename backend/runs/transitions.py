"""The only writer of a run's state. Every change of `Run.state`, and of the fields that go with it, is one
function here, and each checks the state table (`states.ALLOWED`) first: a change the table does not allow
raises IllegalTransition and writes nothing.

API side (the caller's session, which the caller commits): `approve`, `queue_retry`, `request_cancel`,
`mark_lost`. Slurm poller (backend/executors/slurm/poller.py; a session of their own): `slurm_submitted`,
`slurm_observed`, `slurm_started`, `slurm_requeued`, `slurm_finished`, and `slurm_heartbeat` from inside the job.
Worker side (a session of their own, committed on return): `claim`, `start`, `heartbeat`,
`finish`; these name the attempt they act for, and do nothing once it is no longer the run's live attempt (the
reaper marked it lost, and maybe queued the next one). tests/unit/test_run_transitions.py holds the line that
nothing else writes a state.
"""
from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import cast

from pydantic import ValidationError
from sqlalchemy import CursorResult, func, or_, select, update
from sqlalchemy.orm import Session

from backend.core.db import session_scope
from backend.core.settings import get_settings
from backend.inputs.paths import refused_paths
from backend.metrics.models import MetricPoint
from backend.runs.attempts import RunAttempt
from backend.runs.checkpoint_list import inherited_reference
from backend.runs.models import Run
from backend.runs.states import ACTIVE, ALLOWED, TERMINAL, IllegalTransition, RunState, check_transition

log = logging.getLogger(__name__)
# The worker's read-then-write of its run holds the row (PostgreSQL: FOR NO KEY UPDATE, the lock an UPDATE takes
# anyway, so metric inserts that reference the run are not held up), so the reaper cannot interleave.
_LOCK = {"key_share": True}

# A retry queues the next attempt of a run that ended without succeeding (failed, oom, cancelled, lost); approval,
# the other way into `queued`, is for new runs only.
RETRYABLE = frozenset(st for st in TERMINAL if RunState.QUEUED in ALLOWED.get(st, frozenset()))


def now() -> datetime:
    return datetime.now(UTC)


def as_utc(at: datetime) -> datetime:
    """A stored time, comparable with now(): SQLite gives back naive datetimes (they are UTC)."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _move(run: Run, wanted: RunState, only_from: frozenset[RunState] | None = None) -> None:
    """Set the state after checking the table (and, for actions that share a target, the action's own sources)."""
    if only_from is not None and RunState(run.state) not in only_from:
        raise IllegalTransition(run.state, wanted)
    check_transition(run.state, wanted)
    run.state = wanted.value


def _end(session: Session, run: Run, state: RunState, reason: str | None,
         only_from: frozenset[RunState] | None = None) -> None:
    """Any terminal state: stamp the end and keep the attempt's outcome."""
    if state not in TERMINAL:
        raise IllegalTransition(run.state, state)
    # a rule stopped it (request_stop; or the trainer itself, alerts.trainer_stopped)
    if run.stopped_by and state in (RunState.CANCELLED, RunState.SUCCEEDED, RunState.STOPPED):
        state, reason = RunState.STOPPED, run.exit_reason
    _move(run, state, only_from)
    run.finished_at, run.exit_reason = now(), reason
    record_attempt(session, run)


def record_attempt(session: Session, run: Run) -> None:
    """Keep the finished attempt's outcome in run_attempts (only for an attempt that started)."""
    if run.started_at is None:
        return
    exists = session.query(RunAttempt).filter_by(run_id=run.id, attempt=run.attempt).one_or_none()
    row = exists or RunAttempt(run_id=run.id, attempt=run.attempt)
    row.state, row.worker, row.started_at = run.state, run.worker, run.started_at
    row.finished_at, row.last_step, row.exit_reason = run.finished_at, run.last_step, run.exit_reason
    row.queued_by, row.spec = run.queued_by, run.spec
    session.add(row)


# --- API side -------------------------------------------------------------------------------------------------

def approve(run: Run, by: int | None, forced: bool) -> None:
    """pending_approval -> queued, recording who approved it and whether the estimate said it would not fit."""
    _move(run, RunState.QUEUED, only_from=frozenset({RunState.PENDING_APPROVAL}))
    run.approved_at, run.approved_by, run.forced = now(), by, forced
    run.queued_by = by
    run.queued_at = run.sent_at = now()  # its message goes out right after the commit


def queue_retry(run: Run, by: int | None = None, resume_from: str | None = None) -> None:
    """failed | oom | cancelled | lost -> queued as the next attempt (the worker resumes it from `resume_from`,
    stage<i>/checkpoint-<step>, or else the last checkpoint), queued by `by` (api_tokens.id; None: the reaper or
    Slurm); what the previous attempt left on the run is cleared (run_attempts keeps it), and the divergence rule
    starts from the reference that checkpoint carries. The API's retry passes backend/runs/gate.check_queue first."""
    _move(run, RunState.QUEUED, only_from=RETRYABLE)
    run.attempt, run.cancel_requested = run.attempt + 1, False
    run.worker = run.started_at = run.finished_at = run.heartbeat_at = run.exit_reason = None
    # a Slurm run's next attempt is a new job (slurm_requeued keeps the job that Slurm itself requeued)
    run.slurm_job_id = run.slurm_state = run.slurm_reason = run.slurm_nodes = None
    run.claimed_token_id = run.attempt_first_step = None
    run.queued_by = by
    run.resume_from = resume_from  # None: the newest checkpoint
    run.stopped_by = None  # the rules re-arm: this attempt's alerts are its own
    # the divergence rule's reference: the run's lowest loss up to the checkpoint the attempt resumes from
    run.attempt_loss_first_step = None
    run.attempt_loss_min = run.attempt_loss_inherited = inherited_reference(run.run_dir, resume_from)
    run.queued_at = run.sent_at = now()


def request_cancel(session: Session, run: Run) -> None:
    """A run not started yet is cancelled at once; an active one gets `cancel_requested`, and its worker stops the
    trainer and records `cancelled` (`finish`). A finished run cannot be cancelled."""
    state = RunState(run.state)
    if state in ACTIVE:
        check_transition(run.state, RunState.CANCELLED)
        run.cancel_requested = True
    elif state == RunState.QUEUED and run.attempt > 1:
        _end(session, run, RunState.CANCELLED, "retry cancelled before it started")
    else:  # pending_approval and queued end here; anything else is refused by the table
        _end(session, run, RunState.CANCELLED, "cancelled before it started")


def request_stop(run: Run, reason: str, by: str = "alert") -> None:
    """An active run stopped by a rule (a metric alert, `by` its kind): its worker stops it as a cancel (the trainer
    saves a checkpoint), and the attempt ends `stopped` with this reason (`_end`), neither cancelled nor
    succeeded."""
    check_transition(run.state, RunState.STOPPED)
    run.cancel_requested = True
    run.exit_reason = reason
    run.stopped_by = by[:32]


def mark_lost(session: Session, run: Run, reason: str) -> None:
    """starting | running -> lost (the reaper, when the heartbeat stopped)."""
    _end(session, run, RunState.LOST, reason)


# --- worker side ----------------------------------------------------------------------------------------------

def claim(run_id: int, worker: str, token_id: int | None = None) -> Run | None:
    """queued -> starting for this worker, atomically (one conditional UPDATE): of two deliveries of the same
    message only one gets the run. None if someone else has it, or it is no longer queued. `token_id`, the worker's
    API token, is the only worker token that may then write the run's metrics.

    The run's paths are checked against the allowed roots again (one may have become a symlink out of them since
    submit): a refused run ends `failed` with the field in its reason, and None is answered."""
    claimable = [st.value for st, nxt in ALLOWED.items() if RunState.STARTING in nxt]
    with session_scope() as s:
        res = cast(CursorResult, s.execute(
            update(Run).where(Run.id == run_id, Run.state.in_(claimable))
            .values(state=RunState.STARTING.value, worker=worker, started_at=now(), heartbeat_at=now(),
                    claimed_token_id=token_id)))
        if res.rowcount != 1:
            return None
        run = s.get_one(Run, run_id)
        try:
            refused = refused_paths(run.plan, get_settings())
        except ValidationError:  # a stored plan this version no longer reads: the trainer refuses it at once
            refused = None
        if refused:
            _end(s, run, RunState.FAILED, f"refused when claimed: {refused}")
            log.warning("run %s refused at claim: %s", run_id, refused)
            return None
        return run


def _live(s: Session, run_id: int, attempt: int, wanted: RunState) -> Run | None:
    """The run, locked, if `attempt` is still its live one; None (logged) if that attempt has ended."""
    run = s.get_one(Run, run_id, with_for_update=_LOCK)
    if run.attempt != attempt or RunState(run.state) in TERMINAL:
        log.warning("run %s attempt %s: now %s (attempt %s); not recording %s", run_id, attempt, run.state,
                    run.attempt, wanted.value)
        return None
    return run


def start(run_id: int, attempt: int, run_dir: str) -> bool:
    """starting -> running once the trainer is launched in `run_dir`; False if the attempt is no longer live."""
    with session_scope() as s:
        run = _live(s, run_id, attempt, RunState.RUNNING)
        if run is None:
            return False
        _move(run, RunState.RUNNING)
        run.run_dir = run_dir
        return True


def heartbeat(run_id: int, attempt: int, last_step: int) -> bool:
    """Record that the attempt is alive; answers whether it must stop (cancel requested, or the attempt is no
    longer the run's live one)."""
    with session_scope() as s:
        run = s.get_one(Run, run_id, with_for_update=_LOCK)
        if run.attempt != attempt or RunState(run.state) not in ACTIVE:
            return True
        run.heartbeat_at = now()
        run.last_step = max(run.last_step, last_step)
        return bool(run.cancel_requested)


def missing_steps(s: Session, run: Run) -> int:
    """How many of the steps 1..run.steps have no metric stored (of any name, on any rank) by the live attempt.
    Steps before the first step of the live attempt's metrics file (`attempt_first_step`, the checkpoint it
    resumed) may be an earlier attempt's; from there on only the live attempt's points count, so an earlier
    attempt's value (or a planted one) cannot hide a step this attempt failed to store. Points stored before
    attempts were kept (attempt null) count as the live attempt's."""
    if run.steps <= 0:
        return 0
    first = run.attempt_first_step if run.attempt_first_step is not None else 1
    mine = or_(MetricPoint.attempt.is_(None), MetricPoint.attempt == run.attempt, MetricPoint.step < first)
    stored = s.scalar(select(func.count(func.distinct(MetricPoint.step)))
                      .where(MetricPoint.run_id == run.id, MetricPoint.step >= 1, MetricPoint.step <= run.steps, mine))
    return run.steps - int(stored or 0)


def finish(run_id: int, attempt: int, state: RunState, exit_reason: str | None, last_step: int | None = None) -> bool:
    """The attempt ended in `state` (terminal): record its end, reason and last step, and keep the attempt.
    A trainer that exits cleanly is recorded `succeeded` only if every step 1..N has its metrics stored;
    otherwise `failed`, naming how many are missing. False (and nothing changes) if the attempt is no longer the
    run's live one."""
    with session_scope() as s:
        run = _live(s, run_id, attempt, state)
        if run is None:
            return False
        gap = missing_steps(s, run) if state == RunState.SUCCEEDED else 0
        if gap:
            state = RunState.FAILED
            exit_reason = "\n".join(filter(None, [
                f"the trainer finished, but {gap} of the {run.steps} steps have no metrics stored", exit_reason]))
        if last_step is not None:
            run.last_step = last_step
        run.heartbeat_at = now()
        if state == RunState.CANCELLED and run.exit_reason:  # stopped by a rule (request_stop): say which
            exit_reason = run.exit_reason
        _end(s, run, state, exit_reason, only_from=ACTIVE)  # a refused change rolls all of this back
        return True


# --- Slurm executor -------------------------------------------------------------------------------------------
# A Slurm run has no worker claim: Slurm decides when it starts, and the API's poller
# (backend/executors/slurm/poller.py)
# turns what squeue/scontrol say about its job into these changes. The job id names the attempt: a function acts
# only while `job_id` is the run's job.

def _job_run(s: Session, run_id: int, job_id: str) -> Run | None:
    run = s.get(Run, run_id, with_for_update=_LOCK)
    if run is None or run.slurm_job_id != job_id:
        return None
    return run


def slurm_submitted(run_id: int, attempt: int, job_id: str) -> bool:
    """sbatch took the queued attempt: keep its job id (a poller restart finds the job through it). False if the
    attempt is no longer queued (cancelled meanwhile: the poller cancels the job it finds unowned)."""
    with session_scope() as s:
        run = s.get_one(Run, run_id, with_for_update=_LOCK)
        if run.attempt != attempt or run.state != RunState.QUEUED.value or run.slurm_job_id:
            return False
        run.slurm_job_id, run.slurm_state, run.slurm_reason = job_id, "SUBMITTED", None
        return True


def slurm_observed(run_id: int, job_id: str, slurm_state: str, reason: str | None, nodes: str | None) -> None:
    """What the poller read of the job (no change of the run's state): shown on the run page."""
    with session_scope() as s:
        run = _job_run(s, run_id, job_id)
        if run is not None:
            run.slurm_state, run.slurm_reason, run.slurm_nodes = slurm_state, reason, nodes


def slurm_started(run_id: int, job_id: str, nodes: str, run_dir: str, restarts: int) -> bool:
    """queued -> starting -> running: the job has its nodes. The job's node list stands in for the worker;
    `restarts` is Slurm's restart count of the job this attempt runs in (a later requeue raises it)."""
    with session_scope() as s:
        run = _job_run(s, run_id, job_id)
        if run is None or run.state != RunState.QUEUED.value:
            return False
        _move(run, RunState.STARTING)
        _move(run, RunState.RUNNING)
        run.worker, run.run_dir, run.slurm_nodes = f"slurm job {job_id} on {nodes}"[:200], run_dir, nodes
        run.slurm_restarts = restarts
        run.started_at = run.heartbeat_at = now()
        return True


def slurm_heartbeat(run_id: int, job_id: str, last_step: int) -> None:
    """From inside the job: it is alive and has reached `last_step` (cancel reaches it through scancel)."""
    with session_scope() as s:
        run = _job_run(s, run_id, job_id)
        if run is not None and RunState(run.state) in ACTIVE:
            run.heartbeat_at = now()
            run.last_step = max(run.last_step, last_step)


def slurm_finished(run_id: int, job_id: str, state: RunState, reason: str | None, slurm_state: str) -> bool:
    """The job ended: the run's attempt ends in `state` (terminal). False if the run is not active under it."""
    with session_scope() as s:
        run = _job_run(s, run_id, job_id)
        if run is None or RunState(run.state) not in ACTIVE:
            return False
        run.slurm_state = slurm_state
        _end(s, run, state, reason, only_from=ACTIVE)
        return True


def slurm_requeued(run_id: int, job_id: str, reason: str, restarts: int, keep_job: bool) -> str | None:
    """Slurm took the job's nodes away (requeue, preemption, node failure, time limit) or forgot the job: the
    attempt is `lost` (a run still queued is started first, so the attempt is kept). If retries remain the run is
    queued again as its next attempt, resumed from the last checkpoint: under the same job when Slurm requeued it
    (`keep_job`), else as a new job. Answers "requeued", "lost" (no retry left) or None (not this run's job)."""
    with session_scope() as s:
        run = _job_run(s, run_id, job_id)
        if run is None or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
            return None
        if run.state == RunState.QUEUED.value:
            _move(run, RunState.STARTING)
            run.started_at = now()
        run.slurm_restarts = restarts
        _end(s, run, RunState.LOST, reason)
        if run.attempt - 1 >= run.max_retries:
            return "lost"
        queue_retry(run)
        if keep_job:
            run.slurm_job_id, run.slurm_state = job_id, "REQUEUED"
        return "requeued"


def slurm_refused(run_id: int, attempt: int, reason: str) -> bool:
    """sbatch refused the queued attempt (a partition that does not exist, a time limit above the partition's):
    queued -> starting -> failed with Slurm's reason; it would be refused again."""
    with session_scope() as s:
        run = s.get_one(Run, run_id, with_for_update=_LOCK)
        if run.attempt != attempt or run.state != RunState.QUEUED.value:
            return False
        _move(run, RunState.STARTING)
        _end(s, run, RunState.FAILED, reason)
        return True
