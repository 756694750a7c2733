"""Multi-node runs as a gang of node tasks. The API sends one "execute run N, node k" message per node.
Node 0 claims the run and publishes a c10d rendezvous endpoint in run_nodes; node k claims its own row
(the unique key makes a redelivered message a no-op), waits for the endpoint, and starts its ranks.
torchrun's rendezvous then holds every node until all have joined."""
from __future__ import annotations

import logging
import socket
import time
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from backend.core.db import session_scope
from backend.core.settings import get_settings
from backend.runs.models import Run
from backend.runs.nodes import RunNode
from backend.runs.states import ACTIVE, RunState
from backend.runs.transitions import now
from worker.trainer.net import free_port

log = logging.getLogger(__name__)
ENDPOINT_WAIT_S = 300.0


def num_nodes(spec: dict) -> int:
    return max(1, int(spec.get("hardware", {}).get("num_nodes", 1) or 1))


def interface_address(name: str) -> str:
    """The IPv4 address of a network interface (Linux SIOCGIFADDR); OSError if it has none."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
    return socket.inet_ntoa(packed[20:24])


def route_address(host: str, port: int) -> str:
    """The local address this host uses to reach host:port (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def node_address() -> str:
    """The address other nodes reach this one at: ULAB_NODE_ADDRESS; else ULAB_NODE_INTERFACE's address; else the
    address this host reaches the broker from (in a container without host networking that is the bridge's,
    which other nodes cannot reach: docker-compose.yml gives the worker host networking); else the host name's."""
    settings = get_settings()
    if settings.node_address:
        return settings.node_address
    if settings.node_interface:
        return interface_address(settings.node_interface)  # a named interface without an address is an error
    broker = urlsplit(settings.resolved_broker_url)
    if broker.hostname:
        try:
            return route_address(broker.hostname, broker.port or 6379)
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def publish_endpoint(run: Run, worker: str) -> str:
    """Node 0: record this node and the rendezvous endpoint (host:port) for the others."""
    endpoint = f"{node_address()}:{free_port('')}"  # any interface: the other nodes connect from afar
    with session_scope() as s:
        s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=0, worker=worker, rdzv_endpoint=endpoint,
                      heartbeat_at=now()))
    return endpoint


def claim_node(run_id: int, node_rank: int, worker: str, token_id: int | None = None) -> Run | None:
    """Node k > 0: claim (run, attempt, k); None if the run is over or another delivery has the node. `token_id`
    (the node worker's API token) may then write the run's metrics beside node 0's."""
    with session_scope() as s:
        run = s.get(Run, run_id)
        if run is None or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
            return None
        s.add(RunNode(run_id=run.id, attempt=run.attempt, node_rank=node_rank, worker=worker, heartbeat_at=now(),
                      claimed_token_id=token_id))
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
            if run is None or run.attempt != attempt or RunState(run.state) not in (RunState.QUEUED, *ACTIVE):
                return None
        time.sleep(0.5)
    return None


def node_heartbeat(run_id: int, attempt: int, node_rank: int) -> bool:
    """Node k > 0: record that it is alive; answers whether it must stop (the run ended, was cancelled or
    moved to another attempt)."""
    with session_scope() as s:
        node = s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                              RunNode.node_rank == node_rank))
        run = s.get(Run, run_id)
        if node is None or run is None:  # its rows were removed (by hand): nothing to train for
            return True
        node.heartbeat_at = now()
        return run.attempt != attempt or run.cancel_requested or RunState(run.state) not in (RunState.QUEUED, *ACTIVE)


def record_node_exit(run_id: int, attempt: int, node_rank: int, code: int) -> None:
    with session_scope() as s:
        node = s.scalar(select(RunNode).where(RunNode.run_id == run_id, RunNode.attempt == attempt,
                                              RunNode.node_rank == node_rank))
        if node is None:
            log.warning("run %s attempt %s node %s: no node row to record exit code %s on", run_id, attempt,
                        node_rank, code)
            return
        node.exit_code = code
