"""Run lifecycle on the API side: create, approve (then enqueue), cancel, list. The database is the truth."""
from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from backend.api.errors import NotFound, UserError
from backend.auth.roles import Permission
from backend.auth.service import Principal
from backend.core.settings import get_settings
from backend.plans.service import get_plan
from backend.runs.guard import check_run_spec
from backend.runs.models import Run
from backend.runs.schemas import RunCreate
from backend.runs.states import ACTIVE, IllegalTransition, RunState, check_transition

log = logging.getLogger(__name__)


def now() -> datetime:
    return datetime.now(UTC)


def get_run(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


def require_run(session: Session, run_id: int) -> None:
    """404 unless the run exists; reads its key only (the metric routes need no more)."""
    if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
        raise NotFound("run", run_id)


def create_run(session: Session, body: RunCreate, by: Principal) -> Run:
    plan = get_plan(session, body.plan_id)
    spec = check_run_spec({**plan.spec, "run": body.run.model_dump(mode="json", exclude_none=True)}, get_settings())
    run = Run(name=body.name or plan.name or f"plan {plan.id}", plan_id=plan.id, spec=spec,
              estimate=plan.estimate, priority=body.priority, steps=body.run.total_steps(),
              state=RunState.PENDING_APPROVAL.value, submitted_by=by.token_id, max_retries=body.max_retries)
    session.add(run)
    session.commit()
    return run


def does_not_fit(estimate: dict | None) -> str | None:
    """Why the plan's estimate says the run will not fit (GPU or CPU memory), or None."""
    memory = (estimate or {}).get("memory") or {}
    if memory.get("fits") is False:
        return (f"the estimate needs {memory.get('device_total_gib')} GiB per GPU; "
                f"the GPU has {memory.get('gpu_capacity_gib')} GiB")
    if memory.get("cpu_fits") is False:
        return f"the estimate needs {memory.get('cpu_gib_per_node')} GiB of CPU memory per node, more than the node has"
    return None


def approve_run(session: Session, run_id: int, by: Principal, force: bool = False) -> Run:
    run = get_run(session, run_id)
    if run.state != RunState.PENDING_APPROVAL:  # approval is for new runs; a retry has its own action
        raise IllegalTransition(run.state, RunState.QUEUED)
    reason = does_not_fit(run.estimate)
    if reason and not force:
        raise UserError(409, "estimate.memory", f"{reason}; approve with force=true to run it anyway")
    run.state, run.approved_at, run.approved_by = RunState.QUEUED.value, now(), by.token_id
    run.forced = bool(reason)
    session.commit()  # the message goes out only after the approval is committed
    enqueue(run)
    return run


def enqueue(run: Run) -> None:
    from worker.celery_app import send_execute_run

    try:
        send_execute_run(run.id, gpu_name(run.spec), priority=run.priority,
                         num_nodes=max(1, int(run.spec["hardware"].get("num_nodes", 1) or 1)))
    except Exception:  # the run stays queued; the reconciler sends it again
        log.exception("could not send run %s to the queue", run.id)


def retry_run(session: Session, run_id: int) -> Run:
    """Queue the next attempt of a run that did not succeed; the worker resumes it from its last checkpoint."""
    run = get_run(session, run_id)
    queue_retry(run)
    session.commit()
    enqueue(run)
    return run


def queue_retry(run: Run) -> None:
    check_transition(run.state, RunState.QUEUED)
    run.state, run.attempt, run.cancel_requested = RunState.QUEUED.value, run.attempt + 1, False
    run.worker = run.started_at = run.finished_at = run.heartbeat_at = run.exit_reason = None


def gpu_name(spec: dict) -> str:
    gpu = spec.get("hardware", {}).get("gpu", "")
    return gpu.get("name", "custom") if isinstance(gpu, dict) else str(gpu)


def cancel_run(session: Session, run_id: int, by: Principal) -> Run:
    run = get_run(session, run_id)
    if not by.can(Permission.CANCEL_ANY) and (by.token_id is None or run.submitted_by != by.token_id):
        raise UserError(403, "authorization", "a submitter may cancel only the runs they submitted")
    state = RunState(run.state)
    if state == RunState.QUEUED and run.attempt > 1:  # a queued retry: back to where it ended
        run.state, run.finished_at, run.exit_reason = RunState.CANCELLED.value, now(), "retry cancelled before it started"
    elif state in (RunState.PENDING_APPROVAL, RunState.QUEUED):
        run.state, run.finished_at, run.exit_reason = RunState.CANCELLED.value, now(), "cancelled before it started"
    elif state in ACTIVE:
        run.cancel_requested = True  # the worker stops the process group and records `cancelled`
    else:
        raise IllegalTransition(run.state, RunState.CANCELLED)
    session.commit()
    return run


def list_runs(session: Session, state: str | None = None, q: str | None = None, limit: int = 500) -> list[Run]:
    query = select(Run).order_by(Run.id.desc()).limit(limit)
    if state:
        query = query.where(Run.state.in_(state.split(",")))
    if q:
        query = query.where(or_(Run.name.ilike(f"%{q}%"), Run.state.ilike(f"%{q}%")))
    return list(session.scalars(query))


def log_tail(run: Run, lines: int) -> list[str]:
    if not run.run_dir:
        return []
    path = Path(run.run_dir) / "train.log"
    if not path.is_file():
        return []
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 256 * lines))
        text = f.read().decode("utf-8", "replace")
    return text.splitlines()[-lines:]
