"""Multi-node runs as a gang of node tasks. The API sends one "execute run N, node k" message per node.
Node 0 claims the run and publishes a c10d rendezvous endpoint in run_nodes; node k claims its own row
(the unique key makes a redelivered message a no-op), waits for the endpoint, and starts its ranks.
torchrun's rendezvous then holds every node until all have joined."""
from __future__ import annotations

import logging
import socket
import time

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backend.core.db import session_scope
from backend.core.settings import get_settings
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from backend.runs.service import now
from backend.runs.states import ACTIVE, RunState

log = logging.getLogger(__name__)
ENDPOINT_WAIT_S = 300.0


def num_nodes(spec: dict) -> int:
    return max(1, int(spec.get("hardware", {}).get("num_nodes", 1) or 1))


def node_address() -> str:
    """The address other nodes reach this one at: ULAB_NODE_ADDRESS, else this host's resolved name."""
    configured = get_settings().node_address
    if configured:
        return configured
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def publish_endpoint(run: Run, worker: str) -> str:
    """Node 0: record this node and the rendezvous endpoint (host:port) for the others."""
    endpoint = f"{node_address()}:{free_port()}"
    with session_scope() as s:
        s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=0, worker=worker, rdzv_endpoint=endpoint,
                      heartbeat_at=now()))
    return endpoint


def claim_node(run_id: int, node_rank: int, worker: str) -> Run | None:
    """Node k > 0: claim (run, attempt, k); None if the run is over or another delivery has the node."""
    with session_scope() as s:
        run = s.get(Run, run_id)
        if run is None or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
            return None
        s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=node_rank, worker=worker, heartbeat_at=now()))
        try:
            s.flush()
        except IntegrityError:
            return None
        return run


def wait_for_endpoint(run_id: int, attempt: int) -> str | None:
    """Node k > 0: node 0's endpoint once published; None if the run ends (or moves on) first."""
    end = time.monotonic() + ENDPOINT_WAIT_S
    while time.monotonic() < end:
        with session_scope() as s:
            endpoint = s.scalar(select(RunNode.rdzv_endpoint).where(
                RunNode.run_id == run_id, RunNode.attempt == attempt, RunNode.node_rank == 0))
            run = s.get(Run, run_id)
            if endpoint:
                return endpoint
            if run.attempt != attempt or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
                return None
        time.sleep(0.5)
    return None


def node_heartbeat(run_id: int, attempt: int, node_rank: int) -> bool:
    """Node k > 0: record that it is alive; answers whether it must stop (the run ended, was cancelled or
    moved to another attempt)."""
    with session_scope() as s:
        node = s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                              RunNode.node_rank == node_rank))
        node.heartbeat_at = now()
        run = s.get(Run, run_id)
        return run.attempt != attempt or run.cancel_requested or RunState(run.state) not in (RunState.QUEUED, *ACTIVE)


def record_node_exit(run_id: int, attempt: int, node_rank: int, code: int) -> None:
    with session_scope() as s:
        node = s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                              RunNode.node_rank == node_rank))
        node.exit_code = code
