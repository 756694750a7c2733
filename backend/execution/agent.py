"""The one seam between the workers and the service: everything a Celery worker (worker/tasks.py), a node of a gang
(worker/gang.py), a node of a Slurm job (worker/slurm_job.py) and the tracker forwarder (worker/trackers.py) do to
a run goes through `RunAgent`: claim, start, heartbeat, node registration, finish (which stores a probe's result
and the calibration point, backend/execution/outcome.py), the worker's credentials and its capabilities report.

`RunAgent` is the interface; `SqlRunAgent` implements it on the database (every state change through
backend/runs/transitions.py), which is how workers reach the service today. A worker that may not reach the
database would get an HTTP implementation of the same interface (as MLflow's RestStore beside its SQL store)
without a change to worker/. `worker/` imports nothing else of the backend but backend.core.settings: what it
needs of the rest (the run states, the task name, the queue's broker settings, the log tail) is re-exported here.
The answers are plain data (`Claim`, `Credentials`, `StoredRun`), never database rows, so they can cross a wire.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, cached_property
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.alerts import service as alerts
from backend.auth.service import worker_token
from backend.core.db import session_scope
from backend.core.logs import tail_lines
from backend.core.queue import EXECUTE_RUN, broker_config, broker_url, queue_for
from backend.core.settings import get_settings
from backend.execution.outcome import end_attempt
from backend.metrics.models import MetricPoint
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from backend.runs.states import ACTIVE, TERMINAL, RunState
from backend.workers import service as workers
from plan.model import Plan

__all__ = ["EXECUTE_RUN", "Claim", "Credentials", "Endpoint", "RunAgent", "RunState", "SqlRunAgent", "StoredRun",
           "broker_config", "broker_url", "get_agent", "queue_for", "tail_lines"]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Credentials:
    """The token a worker ships metrics with (Authorization: Bearer) and its id, recorded on the runs it claims."""

    token: str
    token_id: int | None


@dataclass(frozen=True)
class Claim:
    """What a worker knows of the run (or node) it claimed: the live attempt and what it needs to launch it."""

    id: int
    attempt: int
    spec: dict
    worker: str | None = None
    kind: str = "train"
    resume_from: str | None = None
    probe_request: dict | None = None

    @cached_property
    def plan(self) -> Plan:
        """The stored plan, validated by the plan model (once)."""
        return Plan.model_validate(self.spec)


@dataclass(frozen=True)
class Endpoint:
    """Node 0's rendezvous endpoint for an attempt (None until published), and whether the attempt still runs."""

    address: str | None
    live: bool


@dataclass(frozen=True)
class StoredRun:
    """What the service stored of a run, as the tracker forwarder reads it: metric rows (step, rank, name, value)
    after a cursor, in step order (up to the newest complete step while the run goes on)."""

    state: str
    ended: bool
    plan: dict
    estimate: dict | None
    alerts: dict[str, str]
    rows: list[tuple[int, int, str, float]] = field(default_factory=list)


class RunAgent(Protocol):
    def credentials(self) -> Credentials:
        """This worker's token (ULAB_WORKER_TOKEN, else the one kept under ULAB_HOME) and its id."""

    def claim(self, run_id: int, worker: str, token_id: int | None) -> Claim | None:
        """queued -> starting for `worker`; None if another delivery has it or it is no longer queued."""

    def start(self, run_id: int, attempt: int, run_dir: str) -> bool:
        """starting -> running once the trainer runs in `run_dir`; False if the attempt is no longer live."""

    def heartbeat(self, run_id: int, attempt: int, last_step: int) -> bool:
        """The attempt is alive at `last_step`; answers whether it must stop."""

    def finish(self, run_id: int, attempt: int, state: RunState, reason: str | None,
               last_step: int | None = None) -> bool:
        """The attempt ended in `state`; a probe's result and the calibration point are stored with it."""

    def claim_node(self, run_id: int, node_rank: int, worker: str, token_id: int | None) -> Claim | None:
        """Node k > 0 of a gang claims its row; None if the run is over or another delivery has the node."""

    def register_node(self, run_id: int, attempt: int, worker: str, endpoint: str) -> None:
        """Node 0 records itself and the rendezvous endpoint for the other nodes."""

    def endpoint(self, run_id: int, attempt: int) -> Endpoint:
        """Node 0's endpoint for the attempt, if published, and whether the attempt is still live."""

    def node_heartbeat(self, run_id: int, attempt: int, node_rank: int) -> bool:
        """Node k > 0 is alive; answers whether it must stop."""

    def node_exit(self, run_id: int, attempt: int, node_rank: int, code: int) -> None:
        """Node k > 0's trainer exited with `code`."""

    def job_heartbeat(self, run_id: int, job_id: str, last_step: int) -> None:
        """From inside a Slurm job: alive at `last_step` (cancel reaches the job through scancel)."""

    def stored(self, run_id: int, after: int) -> StoredRun:
        """The run's state, plan, estimate, alerts and metric rows after step `after`."""

    def worker_started(self, hostname: str, queues: list[str], capabilities: dict) -> None:
        """A worker's library versions, kernels and GPU, shown at GET /api/workers."""

    def worker_stopped(self, hostname: str) -> None:
        """A worker shut down."""

    def worker_heartbeat(self, hostname: str) -> bool:
        """A running worker's periodic sign of life; False when it never reported or has stopped."""

    def trainer_stopped(self, run_id: int, attempt: int, kind: str, step: int, message: str) -> bool:
        """The trainer of `attempt` stopped itself on stop rule `kind` at `step` (worker/trainer/guard.py): the
        alert it stopped on, one row whichever of this and the metrics' ingest comes first."""


def _claim(run: Run) -> Claim:  # read inside its session
    return Claim(id=run.id, attempt=run.attempt, spec=dict(run.spec or {}), worker=run.worker, kind=run.kind,
                 resume_from=run.resume_from, probe_request=run.probe_request)


class SqlRunAgent:
    """`RunAgent` on the service's database (a session of its own per call, committed on return)."""

    def __init__(self) -> None:
        self._credentials: Credentials | None = None

    def credentials(self) -> Credentials:
        if self._credentials is None:  # restarts of a worker reuse the kept token, so live tokens do not pile up
            with session_scope() as s:
                token, principal = worker_token(s, get_settings())
            self._credentials = Credentials(token, principal.token_id if principal is not None else None)
        return self._credentials

    def claim(self, run_id: int, worker: str, token_id: int | None) -> Claim | None:
        run = transitions.claim(run_id, worker, token_id=token_id)
        return None if run is None else _claim(run)

    def start(self, run_id: int, attempt: int, run_dir: str) -> bool:
        return transitions.start(run_id, attempt, run_dir)

    def heartbeat(self, run_id: int, attempt: int, last_step: int) -> bool:
        return transitions.heartbeat(run_id, attempt, last_step)

    def finish(self, run_id: int, attempt: int, state: RunState, reason: str | None,
               last_step: int | None = None) -> bool:
        return end_attempt(run_id, state, lambda: transitions.finish(run_id, attempt, state, reason,
                                                                      last_step=last_step))

    def claim_node(self, run_id: int, node_rank: int, worker: str, token_id: int | None) -> Claim | None:
        with session_scope() as s:
            run = s.get(Run, run_id)
            if run is None or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
                return None
            s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=node_rank, worker=worker,
                          heartbeat_at=_now(), claimed_token_id=token_id))
            try:
                s.flush()
            except IntegrityError:
                return None
            return _claim(run)

    def register_node(self, run_id: int, attempt: int, worker: str, endpoint: str) -> None:
        with session_scope() as s:
            s.add(RunNode(run_id=run_id, attempt=attempt, node_rank=0, worker=worker, rdzv_endpoint=endpoint,
                          heartbeat_at=_now()))

    def endpoint(self, run_id: int, attempt: int) -> Endpoint:
        with session_scope() as s:
            address = s.scalar(select(RunNode.rdzv_endpoint).where(
                RunNode.run_id == run_id, RunNode.attempt == attempt, RunNode.node_rank == 0))
            run = s.get(Run, run_id)
            live = run is not None and run.attempt == attempt and RunState(run.state) in (RunState.QUEUED, *ACTIVE)
            return Endpoint(address or None, live)

    def node_heartbeat(self, run_id: int, attempt: int, node_rank: int) -> bool:
        with session_scope() as s:
            node = _node(s, run_id, attempt, node_rank)
            run = s.get(Run, run_id)
            if node is None or run is None:  # its rows were removed (by hand): nothing to train for
                return True
            node.heartbeat_at = _now()
            return run.attempt != attempt or bool(run.cancel_requested) or \
                RunState(run.state) not in (RunState.QUEUED, *ACTIVE)

    def node_exit(self, run_id: int, attempt: int, node_rank: int, code: int) -> None:
        with session_scope() as s:
            node = _node(s, run_id, attempt, node_rank)
            if node is None:
                log.warning("run %s attempt %s node %s: no node row to record exit code %s on", run_id, attempt,
                            node_rank, code)
                return
            node.exit_code = code

    def job_heartbeat(self, run_id: int, job_id: str, last_step: int) -> None:
        transitions.slurm_heartbeat(run_id, job_id, last_step)

    def stored(self, run_id: int, after: int) -> StoredRun:
        with session_scope() as s:
            run = s.get(Run, run_id)
            if run is None:
                raise LookupError(f"run_id: run {run_id} does not exist")
            ended = RunState(run.state) in TERMINAL
            newest = s.scalar(select(func.max(MetricPoint.step)).where(MetricPoint.run_id == run_id)) or 0
            upto = newest if ended else newest - 1
            rows = s.execute(select(MetricPoint.step, MetricPoint.rank, MetricPoint.name, MetricPoint.value)
                             .where(MetricPoint.run_id == run_id, MetricPoint.step > after, MetricPoint.step <= upto)
                             .order_by(MetricPoint.step, MetricPoint.rank, MetricPoint.name)).all()
            alerts = {a.kind: f"step {a.step}: {a.message}" for a in run.alerts}
            return StoredRun(state=run.state, ended=ended, plan=dict(run.spec or {}), estimate=run.estimate,
                             alerts=alerts, rows=[(r[0], r[1], r[2], r[3]) for r in rows])

    def worker_started(self, hostname: str, queues: list[str], capabilities: dict) -> None:
        with session_scope() as s:
            workers.report(s, hostname, queues, capabilities)

    def worker_stopped(self, hostname: str) -> None:
        with session_scope() as s:
            workers.stopped(s, hostname)

    def worker_heartbeat(self, hostname: str) -> bool:
        with session_scope() as s:
            return workers.heartbeat(s, hostname)

    def trainer_stopped(self, run_id: int, attempt: int, kind: str, step: int, message: str) -> bool:
        return alerts.trainer_stopped(run_id, attempt, kind, step, message)


def _now() -> datetime:
    return transitions.now()


def _node(s: Session, run_id: int, attempt: int, node_rank: int) -> RunNode | None:
    return s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                          RunNode.node_rank == node_rank))


@cache
def get_agent() -> RunAgent:
    """The worker's way to the service. Only the database one exists; an HTTP one would be chosen here."""
    return SqlRunAgent()
