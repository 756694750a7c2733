"""The one seam between the workers and the service: everything a Celery worker (worker/tasks.py), a node of a gang
(worker/gang.py), a node of a Slurm job (worker/slurm_job.py) and the tracker forwarder (worker/trackers.py) do to
a run goes through `RunAgent`: claim, start, heartbeat, node registration, finish (which stores a probe's result
and the calibration point, backend/execution/outcome.py), the worker's token and its capabilities report.

`RunAgent` is the interface and `HttpRunAgent` the only implementation a worker has: it calls the service's agent
API (/api/agent/v1, backend/execution/router.py), behind which `SqlRunAgent` (backend/execution/sql_agent.py, inside the
service only) does the work on the database, as MLflow's RestStore stands before its SQL store. A worker holds no
database URL: with its own token, scoped to its queues, it claims a run and is handed a token of that run's attempt
(`Claim.token`), which every later call about the attempt and the metrics shipper present, and which expires with
the attempt (backend/execution/attempt_tokens.py). A Slurm job gets its attempt's token from the API that submitted it
(ULAB_ATTEMPT_TOKEN).

This module imports no SQLAlchemy and nothing of the service but the settings and the queue's naming. `worker/`
imports nothing else of the backend: what it needs of the rest (the run states, the task name, the queue's broker
settings, the log tail) is re-exported here. The answers are plain data (`Claim`, `Endpoint`, `StoredRun`).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from functools import cache, cached_property
from typing import Any, Protocol

import httpx

from backend.core.logs import tail_lines
from backend.core.queue import EXECUTE_RUN, broker_config, broker_url, queue_for
from backend.core.settings import Settings, get_settings
from backend.runs.states import RunState
from plan.model import Plan

__all__ = ["AGENT_API", "EXECUTE_RUN", "AgentRefused", "Claim", "Endpoint", "HttpRunAgent", "RunAgent", "RunState",
           "StoredRun", "broker_config", "broker_url", "get_agent", "queue_for", "tail_lines", "unreachable",
           "worker_token"]
log = logging.getLogger(__name__)
AGENT_API = "/api/agent/v1"
WORKER_TOKEN_FILE = "worker-token"  # under ULAB_HOME, written by `ulab token create --role worker --file ...`


@dataclass(frozen=True)
class Claim:
    """What a worker knows of the run (or node) it claimed: the live attempt, what it needs to launch it, and the
    attempt's token (its later calls and the metrics it ships present it; it expires with the attempt)."""

    id: int
    attempt: int
    spec: dict
    worker: str | None = None
    kind: str = "train"
    resume_from: str | None = None
    probe_request: dict | None = None
    token: str = field(default="", repr=False)

    @cached_property
    def plan(self) -> Plan:
        """The stored plan, validated by the plan model (once)."""
        return Plan.model_validate(self.spec)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


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


class AgentRefused(RuntimeError):
    """The service refused a call (a token out of its scope, an attempt that ended); the message is its reason and
    `status_code` the HTTP status (None: refused before any request, e.g. no token)."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


def unreachable(exc: BaseException) -> bool:
    """Whether a call failed because the service could not answer (not reached, cut off, timed out, or a 5xx from
    it or a proxy before it, as while it restarts): worth trying again, unlike a refusal."""
    if isinstance(exc, httpx.TransportError):
        return True
    return isinstance(exc, AgentRefused) and exc.status_code is not None and exc.status_code >= 500


class RunAgent(Protocol):
    def claim(self, run_id: int, worker: str) -> Claim | None:
        """queued -> starting for `worker`; None if another delivery has it or it is no longer queued."""

    def start(self, run_id: int, attempt: int, run_dir: str) -> bool:
        """starting -> running once the trainer runs in `run_dir`; False if the attempt is no longer live."""

    def heartbeat(self, run_id: int, attempt: int, last_step: int) -> bool:
        """The attempt is alive at `last_step`; answers whether it must stop."""

    def finish(self, run_id: int, attempt: int, state: RunState, reason: str | None,
               last_step: int | None = None) -> bool:
        """The attempt ended in `state`; a probe's result and the calibration point are stored with it."""

    def claim_node(self, run_id: int, node_rank: int, worker: str) -> Claim | None:
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
        """The trainer of `attempt` stopped itself on stop rule `kind` at `step` (worker/trainer/stop_rules.py): the
        alert it stopped on, one row whichever of this and the metrics' ingest comes first."""


def worker_token(settings: Settings) -> str:
    """The worker's own token: ULAB_WORKER_TOKEN, else the one an administrator kept in ULAB_HOME/worker-token. A
    worker never mints one: it holds no database URL."""
    if settings.worker_token:
        return settings.worker_token
    path = settings.home / WORKER_TOKEN_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    raise AgentRefused(f"no worker token: set ULAB_WORKER_TOKEN, or keep one in {path} "
                       "(`ulab token create --role worker --queue QUEUE --file PATH`)")


class HttpRunAgent:
    """`RunAgent` over the service's agent API. The worker's token claims runs and reports the worker; the attempt's
    token (from the claim, or ULAB_ATTEMPT_TOKEN in a Slurm job) acts for the attempt. `client` is the HTTP client
    (tests pass the app's in-process one)."""

    def __init__(self, settings: Settings, client: httpx.Client | None = None):
        self.settings = settings
        self.client = client or httpx.Client(base_url=settings.api_url, timeout=30.0)
        self._attempt_tokens: dict[int, str] = {}

    def attempt_token(self, run_id: int) -> str:
        """The token of the run's attempt this process acts for: the one its claim handed out, else a Slurm job's."""
        token = self._attempt_tokens.get(run_id) or self.settings.attempt_token
        if not token:
            raise AgentRefused(f"run {run_id}: this process holds no token of the run's attempt (claim it first)")
        return token

    def _call(self, method: str, path: str, token: str, body: dict | None = None,
              params: dict | None = None, absent: tuple[int, ...] = ()) -> Any:
        r = self.client.request(method, AGENT_API + path, json=body, params=params,
                                headers={"Authorization": f"Bearer {token}"})
        if r.status_code in absent:
            return None
        if r.status_code >= 400:
            raise AgentRefused(f"{method} {AGENT_API}{path}: {r.status_code} {r.text[:500]}", r.status_code)
        return r.json()

    def _run(self, method: str, run_id: int, path: str, body: dict | None = None, ended: Any = None,
             **kw: Any) -> Any:
        """A call for the run's attempt; `ended` (when given) is the answer once the attempt's token is no longer
        live (401: the attempt ended or moved on, so the trainer must stop and nothing is recorded)."""
        got = self._call(method, f"/runs/{run_id}{path}", self.attempt_token(run_id), body,
                         absent=(401,) if ended is not None else (), **kw)
        return ended if got is None else got

    def _claimed(self, got: dict | None) -> Claim | None:
        if got is None:
            return None
        claim = Claim(**got)
        self._attempt_tokens[claim.id] = claim.token
        return claim

    def claim(self, run_id: int, worker: str) -> Claim | None:
        return self._claimed(self._call("POST", f"/runs/{run_id}/claim", worker_token(self.settings),
                                        {"worker": worker}, absent=(409,)))

    def claim_node(self, run_id: int, node_rank: int, worker: str) -> Claim | None:
        return self._claimed(self._call("POST", f"/runs/{run_id}/nodes/{node_rank}/claim",
                                        worker_token(self.settings), {"worker": worker}, absent=(409,)))

    def start(self, run_id: int, attempt: int, run_dir: str) -> bool:
        return bool(self._run("POST", run_id, f"/attempts/{attempt}/start", {"run_dir": run_dir},
                              ended={"ok": False})["ok"])

    def heartbeat(self, run_id: int, attempt: int, last_step: int) -> bool:
        return bool(self._run("POST", run_id, f"/attempts/{attempt}/heartbeat", {"last_step": last_step},
                              ended={"stop": True})["stop"])

    def finish(self, run_id: int, attempt: int, state: RunState, reason: str | None,
               last_step: int | None = None) -> bool:
        return bool(self._run("POST", run_id, f"/attempts/{attempt}/finish",
                              {"state": state.value, "reason": reason, "last_step": last_step},
                              ended={"ok": False})["ok"])

    def register_node(self, run_id: int, attempt: int, worker: str, endpoint: str) -> None:
        self._run("POST", run_id, f"/attempts/{attempt}/nodes/0", {"worker": worker, "endpoint": endpoint})

    def endpoint(self, run_id: int, attempt: int) -> Endpoint:
        got = self._run("GET", run_id, f"/attempts/{attempt}/endpoint", ended={"address": None, "live": False})
        return Endpoint(got["address"], bool(got["live"]))

    def node_heartbeat(self, run_id: int, attempt: int, node_rank: int) -> bool:
        return bool(self._run("POST", run_id, f"/attempts/{attempt}/nodes/{node_rank}/heartbeat",
                              ended={"stop": True})["stop"])

    def node_exit(self, run_id: int, attempt: int, node_rank: int, code: int) -> None:
        self._run("POST", run_id, f"/attempts/{attempt}/nodes/{node_rank}/exit", {"code": code}, ended={"ok": False})

    def job_heartbeat(self, run_id: int, job_id: str, last_step: int) -> None:
        self._run("POST", run_id, f"/jobs/{job_id}/heartbeat", {"last_step": last_step})

    def stored(self, run_id: int, after: int) -> StoredRun:
        got = self._run("GET", run_id, "/stored", params={"after": after})
        return StoredRun(state=got["state"], ended=got["ended"], plan=got["plan"], estimate=got["estimate"],
                         alerts=got["alerts"], rows=[(r[0], r[1], r[2], r[3]) for r in got["rows"]])

    def worker_started(self, hostname: str, queues: list[str], capabilities: dict) -> None:
        self._call("POST", f"/workers/{hostname}/started", worker_token(self.settings),
                   {"queues": queues, "capabilities": capabilities})

    def worker_stopped(self, hostname: str) -> None:
        self._call("POST", f"/workers/{hostname}/stopped", worker_token(self.settings))

    def worker_heartbeat(self, hostname: str) -> bool:
        return bool(self._call("POST", f"/workers/{hostname}/heartbeat", worker_token(self.settings))["known"])

    def trainer_stopped(self, run_id: int, attempt: int, kind: str, step: int, message: str) -> bool:
        return bool(self._run("POST", run_id, f"/attempts/{attempt}/trainer-stopped",
                              {"kind": kind, "step": step, "message": message}, ended={"ok": False})["ok"])


@cache
def get_agent() -> RunAgent:
    """The worker's way to the service: the agent API at ULAB_API_URL (embedded mode too: one path, not two)."""
    return HttpRunAgent(get_settings())

