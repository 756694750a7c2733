"""HTTP: the agent API, the only way a worker reaches the service (backend/execution/agent.py is its client; the work is
backend/execution/sql_agent.py's). Versioned under /api/agent/v1.

Two kinds of token call it. A worker's own token (role worker) claims runs of its queues only, claims nodes of them,
and reports the worker; it reads no run. Each claim answers a token of the claimed attempt
(backend/execution/attempt_tokens.py), and every call about that attempt presents it: node 0's starts, beats, finishes
and publishes the rendezvous endpoint and reads the run for the tracker forwarder; node k's beats and reports its own
node; a Slurm job's beats for its job. A token refused (another run, another attempt, another node, an attempt that
ended) is a 401 or 403 naming `authorization`."""
from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from backend.api.deps import RowId
from backend.auth.deps import Agent, presented_token
from backend.auth.schemas import QueueName
from backend.auth.service import Principal
from backend.core.db import get_sessionmaker
from backend.core.errors import UserError
from backend.core.queue import plan_gpu_name, queue_for
from backend.execution import attempt_tokens
from backend.execution.agent import AGENT_API
from backend.execution.sql_agent import SqlRunAgent
from backend.executors.registry import executor_for
from backend.runs.models import Run
from backend.runs.states import TERMINAL, RunState

router = APIRouter(prefix=AGENT_API, tags=["agent"])
Name = Annotated[str, Path(min_length=1, max_length=200)]
Attempt = Annotated[int, Path(ge=1, le=2**31 - 1)]
NodeRank = Annotated[int, Path(ge=0, le=4095)]


def verify_attempt_token(token: str) -> Principal | None:
    with get_sessionmaker()() as session:
        return attempt_tokens.verify(session, token)


async def attempt_principal(request: Request) -> Principal:
    """The attempt a request's token acts for: 401 unless it is a live attempt token."""
    token = presented_token(request)
    principal = await run_in_threadpool(verify_attempt_token, token) if token else None
    if principal is None:
        raise UserError(401, "authorization", "not a live attempt token: the attempt ended, or the token is unknown")
    return principal


AttemptToken = Annotated[Principal, Depends(attempt_principal)]


def _refuse(message: str) -> UserError:
    return UserError(403, "authorization", message)


def acts_for(by: Principal, run_id: int, attempt: int | None = None, node_rank: int | None = 0) -> None:
    """403 unless `by` acts for this run (and attempt, and node, when given)."""
    if by.run_id != run_id:
        raise _refuse(f"this token acts for run {by.run_id}, not run {run_id}")
    if attempt is not None and by.attempt != attempt:
        raise _refuse(f"this token acts for attempt {by.attempt} of run {run_id}, not attempt {attempt}")
    if node_rank is not None and by.node_rank != node_rank:
        raise _refuse(f"this token acts for node {by.node_rank} of run {run_id}, not node {node_rank}")


def check_queue(by: Principal, run_id: int) -> None:
    """404 for a run that does not exist; 403 unless workers claim its executor's runs and it is on one of the worker
    token's queues."""
    with get_sessionmaker()() as s:
        run = s.get(Run, run_id)
        if run is None:
            raise UserError(404, "run_id", f"run {run_id} does not exist")
        if not executor_for(run).claimed:
            raise _refuse(f"run {run_id} runs under the {run.executor} executor: no worker claims it")
        try:
            queue = queue_for(plan_gpu_name(run.plan))
        except ValueError:
            queue = ""  # a stored plan this version no longer reads: on no worker's queue
    if queue not in by.queues:
        raise _refuse(f"run {run_id} is on queue {queue or '(none)'}; this worker token serves "
                      f"{', '.join(sorted(by.queues)) or 'no queue'}")


def _claimed(got) -> dict:
    if got is None:
        raise UserError(409, "state", "not claimed: another delivery has it, or it is no longer queued")
    return got.to_json()


class ClaimIn(BaseModel):
    worker: str = Field(min_length=1, max_length=200)


@router.post("/runs/{run_id}/claim")
def claim(run_id: RowId, body: ClaimIn, by: Agent) -> dict:
    """queued -> starting for this worker; answers the claim and its attempt's token (409 if not claimed)."""
    check_queue(by, run_id)
    return _claimed(SqlRunAgent(by.token_id).claim(run_id, body.worker))


@router.post("/runs/{run_id}/nodes/{node_rank}/claim")
def claim_node(run_id: RowId, node_rank: Annotated[int, Path(ge=1, le=4095)], body: ClaimIn, by: Agent) -> dict:
    """Node k > 0 of a gang claims its row; answers the claim and the node's token (409 if not claimed)."""
    check_queue(by, run_id)
    return _claimed(SqlRunAgent(by.token_id).claim_node(run_id, node_rank, body.worker))


class StartIn(BaseModel):
    run_dir: str = Field(min_length=1, max_length=4096)


class Ok(BaseModel):
    ok: bool


class Stop(BaseModel):
    stop: bool


@router.post("/runs/{run_id}/attempts/{attempt}/start")
def start(run_id: RowId, attempt: Attempt, body: StartIn, by: AttemptToken) -> Ok:
    acts_for(by, run_id, attempt)
    return Ok(ok=SqlRunAgent().start(run_id, attempt, body.run_dir))


class Beat(BaseModel):
    last_step: int = Field(ge=0, le=2**31 - 1)


@router.post("/runs/{run_id}/attempts/{attempt}/heartbeat")
def heartbeat(run_id: RowId, attempt: Attempt, body: Beat, by: AttemptToken) -> Stop:
    acts_for(by, run_id, attempt)
    return Stop(stop=SqlRunAgent().heartbeat(run_id, attempt, body.last_step))


class FinishIn(BaseModel):
    state: RunState
    reason: str | None = Field(None, max_length=100_000)
    last_step: int | None = Field(None, ge=0, le=2**31 - 1)


@router.post("/runs/{run_id}/attempts/{attempt}/finish")
def finish(run_id: RowId, attempt: Attempt, body: FinishIn, by: AttemptToken) -> Ok:
    acts_for(by, run_id, attempt)
    if body.state not in TERMINAL:
        raise UserError(422, "state", f"{body.state.value} is not a state an attempt ends in")
    return Ok(ok=SqlRunAgent().finish(run_id, attempt, body.state, body.reason, body.last_step))


class NodeIn(BaseModel):
    worker: str = Field(min_length=1, max_length=200)
    endpoint: str = Field(min_length=3, max_length=300, pattern=r"^[A-Za-z0-9_.:\[\]-]+:\d{1,5}$")


@router.post("/runs/{run_id}/attempts/{attempt}/nodes/0")
def register_node(run_id: RowId, attempt: Attempt, body: NodeIn, by: AttemptToken) -> Ok:
    acts_for(by, run_id, attempt)
    SqlRunAgent().register_node(run_id, attempt, body.worker, body.endpoint)
    return Ok(ok=True)


class EndpointOut(BaseModel):
    address: str | None
    live: bool


@router.get("/runs/{run_id}/attempts/{attempt}/endpoint")
def endpoint(run_id: RowId, attempt: Attempt, by: AttemptToken) -> EndpointOut:
    acts_for(by, run_id, attempt, node_rank=None)  # any node of the attempt
    found = SqlRunAgent().endpoint(run_id, attempt)
    return EndpointOut(address=found.address, live=found.live)


@router.post("/runs/{run_id}/attempts/{attempt}/nodes/{node_rank}/heartbeat")
def node_heartbeat(run_id: RowId, attempt: Attempt, node_rank: NodeRank, by: AttemptToken) -> Stop:
    acts_for(by, run_id, attempt, node_rank)
    return Stop(stop=SqlRunAgent().node_heartbeat(run_id, attempt, node_rank))


class ExitIn(BaseModel):
    code: int = Field(ge=-255, le=255)


@router.post("/runs/{run_id}/attempts/{attempt}/nodes/{node_rank}/exit")
def node_exit(run_id: RowId, attempt: Attempt, node_rank: NodeRank, body: ExitIn, by: AttemptToken) -> Ok:
    acts_for(by, run_id, attempt, node_rank)
    SqlRunAgent().node_exit(run_id, attempt, node_rank, body.code)
    return Ok(ok=True)


class StoppedIn(BaseModel):
    kind: str = Field(min_length=1, max_length=32)
    step: int = Field(ge=0, le=2**31 - 1)
    message: str = Field(max_length=2000)


@router.post("/runs/{run_id}/attempts/{attempt}/trainer-stopped")
def trainer_stopped(run_id: RowId, attempt: Attempt, body: StoppedIn, by: AttemptToken) -> Ok:
    acts_for(by, run_id, attempt)
    return Ok(ok=SqlRunAgent().trainer_stopped(run_id, attempt, body.kind, body.step, body.message))


@router.post("/runs/{run_id}/jobs/{job_id}/heartbeat")
def job_heartbeat(run_id: RowId, job_id: Annotated[str, Path(pattern=r"^\d{1,20}$")], body: Beat,
                  by: AttemptToken) -> Ok:
    acts_for(by, run_id)
    if by.job_id not in (None, job_id):  # None: sbatch has not answered yet (the run's row names its job)
        raise _refuse(f"this token acts for Slurm job {by.job_id}, not job {job_id}")
    SqlRunAgent().job_heartbeat(run_id, job_id, body.last_step)
    return Ok(ok=True)


class StoredOut(BaseModel):
    state: str
    ended: bool
    plan: dict
    estimate: dict | None
    alerts: dict[str, str]
    rows: list[tuple[int, int, str, float]]


@router.get("/runs/{run_id}/stored")
def stored(run_id: RowId, by: AttemptToken, after: int = Query(0, ge=0, le=2**31 - 1)) -> StoredOut:
    """The run's state, plan, estimate, alerts and metric rows after step `after`, for its tracker forwarder."""
    acts_for(by, run_id)
    got = SqlRunAgent().stored(run_id, after)
    return StoredOut(state=got.state, ended=got.ended, plan=got.plan, estimate=got.estimate, alerts=got.alerts,
                     rows=got.rows)


class StartedIn(BaseModel):
    queues: list[QueueName] = Field(max_length=64)
    capabilities: dict


class Known(BaseModel):
    known: bool


@router.post("/workers/{hostname}/started")
def worker_started(hostname: Name, body: StartedIn, by: Agent) -> Ok:
    """A worker's library versions, kernels and GPU (GET /api/workers); only queues its token serves."""
    foreign = sorted(set(body.queues) - by.queues)
    if foreign:
        raise _refuse(f"this worker token does not serve {', '.join(foreign)}")
    SqlRunAgent(by.token_id).worker_started(hostname, body.queues, body.capabilities)
    return Ok(ok=True)


@router.post("/workers/{hostname}/heartbeat")
def worker_heartbeat(hostname: Name, by: Agent) -> Known:
    return Known(known=SqlRunAgent(by.token_id).worker_heartbeat(hostname))


@router.post("/workers/{hostname}/stopped")
def worker_stopped(hostname: Name, by: Agent) -> Ok:
    SqlRunAgent(by.token_id).worker_stopped(hostname)
    return Ok(ok=True)
