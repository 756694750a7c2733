"""Workers' reports (what each can run), and the approval check that a run's kernels exist on its queue (called by
the gate in front of `queued`, backend/runs/gate.py)."""
from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.core.errors import UserError
from backend.core.queue import plan_gpu_name, queue_for
from backend.workers.models import Worker
from plan.model import Plan


def report(session: Session, name: str, queues: list[str], caps: dict) -> Worker:
    """A worker's report at start (worker/trainer/capabilities.py): replaces what the same worker said before."""
    w = session.scalar(select(Worker).where(Worker.name == name)) or Worker(name=name)
    w.queues, w.started_at, w.stopped_at = sorted(queues), datetime.now(UTC), None
    w.gpu_model, w.gpu_count = caps.get("gpu_model"), int(caps.get("gpu_count") or 0)
    w.versions, w.attn_implementations = dict(caps.get("versions") or {}), list(caps.get("attn_implementations") or [])
    session.add(w)
    return w


def stopped(session: Session, name: str) -> None:
    w = session.scalar(select(Worker).where(Worker.name == name))
    if w is not None:
        w.stopped_at = datetime.now(UTC)


def list_workers(session: Session) -> list[Worker]:
    return list(session.scalars(select(Worker).order_by(Worker.stopped_at.is_not(None), Worker.name)))


def check_kernels(session: Session, plan: Plan) -> None:
    """409 naming the field when no running worker of the run's queue has the plan's attention kernel or Liger.
    A queue with no worker reporting says nothing (the run waits for one, as before). A worker without CUDA runs
    every attention as sdpa (plan.launch.effective_attn), so it takes any attention, never Liger."""
    queue = queue_for(plan_gpu_name(plan))
    workers = [w for w in session.scalars(select(Worker).where(Worker.stopped_at.is_(None))) if queue in w.queues]
    if not workers:
        return
    attn = plan.training.attn_implementation
    has = sorted({a for w in workers for a in w.attn_implementations})
    if attn and not any(w.gpu_count == 0 or attn in w.attn_implementations for w in workers):
        raise UserError(409, "training.attn_implementation",
                        f"{attn} is not installed on any {queue} worker (they have {', '.join(has) or 'none'})")
    if plan.training.liger_kernel and not any(w.gpu_count and w.versions.get("liger_kernel") for w in workers):
        raise UserError(409, "training.liger_kernel",
                        f"liger-kernel is not installed on any {queue} worker with a GPU")
