"""`RunAgent` (backend/execution/agent.py) on the service's database, inside the service only: the agent API
(backend/execution/router.py) calls it once it has checked the caller's token. Every state change goes through
backend/runs/transitions.py; each call has a session of its own, committed on return. A claim hands out a token of
the claimed attempt (backend/execution/attempt_tokens.py)."""
from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from backend.alerts import service as alerts
from backend.core.db import session_scope
from backend.execution import attempt_tokens
from backend.execution.agent import Claim, Endpoint, StoredRun
from backend.execution.outcome import end_attempt
from backend.metrics.models import MetricPoint
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from backend.runs.states import ACTIVE, TERMINAL, RunState
from backend.workers import service as workers

log = logging.getLogger(__name__)


def _claim(s: Session, run: Run, node_rank: int = 0) -> Claim:  # read inside its session
    return Claim(id=run.id, attempt=run.attempt, spec=dict(run.spec or {}), worker=run.worker, kind=run.kind,
                 resume_from=run.resume_from, probe_request=run.probe_request,
                 token=attempt_tokens.mint(s, run.id, run.attempt, node_rank))


class SqlRunAgent:
    """`RunAgent` on the database, acting for the worker token `token_id` (recorded on what it claims)."""

    def __init__(self, token_id: int | None = None) -> None:
        self.token_id = token_id

    def claim(self, run_id: int, worker: str) -> Claim | None:
        if transitions.claim(run_id, worker, token_id=self.token_id) is None:
            return None
        with session_scope() as s:
            return _claim(s, s.get_one(Run, run_id))

    def start(self, run_id: int, attempt: int, run_dir: str) -> bool:
        return transitions.start(run_id, attempt, run_dir)

    def heartbeat(self, run_id: int, attempt: int, last_step: int) -> bool:
        return transitions.heartbeat(run_id, attempt, last_step)

    def finish(self, run_id: int, attempt: int, state: RunState, reason: str | None,
               last_step: int | None = None) -> bool:
        return end_attempt(run_id, state, lambda: transitions.finish(run_id, attempt, state, reason,
                                                                      last_step=last_step))

    def claim_node(self, run_id: int, node_rank: int, worker: str) -> Claim | None:
        with session_scope() as s:
            run = s.get(Run, run_id)
            if run is None or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
                return None
            s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=node_rank, worker=worker,
                          heartbeat_at=transitions.now(), claimed_token_id=self.token_id))
            try:
                s.flush()
            except IntegrityError:
                return None
            return _claim(s, run, node_rank)

    def register_node(self, run_id: int, attempt: int, worker: str, endpoint: str) -> None:
        with session_scope() as s:
            s.add(RunNode(run_id=run_id, attempt=attempt, node_rank=0, worker=worker, rdzv_endpoint=endpoint,
                          heartbeat_at=transitions.now()))

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
            node.heartbeat_at = transitions.now()
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


def _node(s: Session, run_id: int, attempt: int, node_rank: int) -> RunNode | None:
    return s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                          RunNode.node_rank == node_rank))

