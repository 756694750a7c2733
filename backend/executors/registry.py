"""The executors, as one table: how an approved run is handed over, whether a worker claims it, and what the API
must run beside it. Adding an executor is one entry here (and its engine's side under backend/executors/).

- celery: a message on the run's GPU queue (backend/executors/celery.py); a worker of that queue (its token names
  the queue) claims the run and beats its heartbeat, so the API's reaper marks it lost when the beats stop
  (backend/execution/reaper.py).
- slurm: one sbatch job per attempt; the Slurm poller (backend/executors/slurm/poller.py) follows the job and moves the
  run, so the reaper leaves it alone (Slurm knows whether the job lives).

A GPU queue's executor is ULAB_EXECUTOR_<QUEUE> (celery when unset)."""
from __future__ import annotations

import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from backend.core.queue import plan_gpu_name, queue_for
from backend.core.settings import Settings
from backend.executors import celery
from backend.executors.slurm import poller as slurm_poller
from backend.runs.models import Run
from plan.model import Plan


@dataclass(frozen=True)
class Executor:
    name: str
    submit: Callable[[Run], None]  # hand the queued run (its live attempt) over; safe to call again for it
    # a worker claims its runs through the agent API (backend/execution/router.py); else the executor starts them
    claimed: bool
    reaped: bool  # the API's reaper marks the run lost when its heartbeat stops
    poller: Callable[[Settings], Coroutine[Any, Any, None]] | None = None  # runs in the API while a queue uses it
    placement: bool = False  # takes a partition and a time limit (slurm_partition, slurm_time_limit)


def _send(run: Run) -> None:
    """One "execute run N" message per node on the queue of the run's GPU type."""
    celery.send(run.id, plan_gpu_name(run.plan), run.priority, run.plan.hardware.num_nodes)


EXECUTORS: dict[str, Executor] = {
    "celery": Executor("celery", submit=_send, claimed=True, reaped=True),
    "slurm": Executor("slurm", submit=slurm_poller.submit, claimed=False, reaped=False,
                      poller=slurm_poller.poll_forever, placement=True),
}
DEFAULT = "celery"


def executor_name(plan: Plan, settings: Settings) -> str:
    """The executor of the run's GPU queue (ULAB_EXECUTOR_<QUEUE>; celery when unset)."""
    queue = queue_for(plan_gpu_name(plan))
    name = settings.per_queue("executor", queue).strip().lower() or DEFAULT
    if name not in EXECUTORS:
        raise ValueError(f"ULAB_EXECUTOR_{queue.upper().replace('-', '_')}={name!r}: "
                         f"must be one of {', '.join(EXECUTORS)}")
    return name


def executor_for(run: Run) -> Executor:
    return EXECUTORS.get(run.executor, EXECUTORS[DEFAULT])


def configured() -> list[Executor]:
    """The executors some GPU queue names (ULAB_EXECUTOR_<QUEUE>), the default one always: the API runs their
    pollers."""
    names = {DEFAULT} | {v.strip().lower() for k, v in os.environ.items() if k.startswith("ULAB_EXECUTOR_")}
    return [EXECUTORS[name] for name in EXECUTORS if name in names]


def reaped() -> list[str]:
    """The executors whose runs the heartbeat reaper watches."""
    return [name for name, ex in EXECUTORS.items() if ex.reaped]
