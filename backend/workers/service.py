"""Workers' reports (what each can run), and the approval check that a run's kernels exist on its queue (called by
the gate in front of `queued`, backend/runs/gate.py)."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from backend.core.errors import UserError
from backend.core.queue import plan_gpu_name, queue_for
from backend.core.settings import get_settings
from backend.workers.models import Worker
from plan.model import Plan


def now() -> datetime:
    return datetime.now(UTC)


def report(session: Session, name: str, queues: list[str], caps: dict) -> Worker:
    """A worker's report at start (worker/trainer/capabilities.py): replaces what the same worker said before."""
    w = session.scalar(select(Worker).where(Worker.name == name)) or Worker(name=name)
    w.queues, w.started_at, w.stopped_at = sorted(queues), now(), None
    w.heartbeat_at = w.started_at
    w.gpu_model, w.gpu_count = caps.get("gpu_model"), int(caps.get("gpu_count") or 0)
    w.versions, w.attn_implementations = dict(caps.get("versions") or {}), list(caps.get("attn_implementations") or [])
    session.add(w)
    return w


def stopped(session: Session, name: str) -> None:
    w = session.scalar(select(Worker).where(Worker.name == name))
    if w is not None:
        w.stopped_at = datetime.now(UTC)


def heartbeat(session: Session, name: str) -> bool:
    """A running worker's periodic sign of life (worker/celery_app.py); False when it never reported or stopped."""
    done = session.execute(update(Worker).where(Worker.name == name, Worker.stopped_at.is_(None))
                           .values(heartbeat_at=now()))
    return bool(getattr(done, "rowcount", 0))


def state(w: Worker, at: datetime | None = None) -> str:
    """`up`; `stopped` (it reported its shutdown); `lost` (no heartbeat for worker_lost_after_s: killed, or its
    machine went away, without a shutdown report)."""
    if w.stopped_at is not None:
        return "stopped"
    last = w.heartbeat_at or w.started_at
    if last.tzinfo is None:  # SQLite hands back naive datetimes (stored as UTC)
        last = last.replace(tzinfo=(at or now()).tzinfo)
    lost_after = timedelta(seconds=get_settings().worker_lost_after_s)
    return "lost" if (at or now()) - last > lost_after else "up"


def list_workers(session: Session) -> list[Worker]:
    """Up ones first, then lost, then stopped; by name."""
    at = now()
    order = {"up": 0, "lost": 1, "stopped": 2}
    return sorted(session.scalars(select(Worker)), key=lambda w: (order[state(w, at)], w.name))


def live_workers(session: Session, queue: str) -> list[Worker]:
    """The workers of `queue` that are up (a lost or stopped worker's kernels count for nothing)."""
    at = now()
    return [w for w in session.scalars(select(Worker).where(Worker.stopped_at.is_(None)))
            if queue in w.queues and state(w, at) == "up"]


def queue_offer(session: Session, gpu: str) -> tuple[list[str] | None, bool]:
    """What the queue of the plan's GPU type `gpu` (backend/core/queue.plan_gpu_name) can run now, for recommend
    and fix (plan.recommend, plan.fix): the attention kernels its live GPU workers report, and whether one of them
    has Liger. A live worker without a GPU runs any attention as sdpa (as approval counts it: check_kernels) and
    says nothing of the GPUs the plan is for, so it limits nothing; (None, True) when no GPU worker of the queue is
    up: nothing is known, nothing is limited."""
    workers = live_workers(session, queue_for(gpu))
    gpus = [w for w in workers if w.gpu_count]
    if not gpus or len(gpus) < len(workers):
        return None, True
    kernels = sorted({a for w in gpus for a in w.attn_implementations})
    return kernels, any(w.versions.get("liger_kernel") for w in gpus)


def check_kernels(session: Session, plan: Plan) -> None:
    """409 naming the field when no live worker of the run's queue has the plan's attention kernel or Liger.
    A queue with no worker up says nothing (the run waits for one, as before). A worker without CUDA runs
    every attention as sdpa (plan.launch.effective_attn), so it takes any attention, never Liger."""
    queue = queue_for(plan_gpu_name(plan))
    workers = live_workers(session, queue)
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
