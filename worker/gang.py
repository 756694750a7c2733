"""Multi-node runs as a gang of node tasks. The API sends one "execute run N, node k" message per node.
Node 0 claims the run and publishes a c10d rendezvous endpoint in run_nodes; node k claims its own row
(the unique key makes a redelivered message a no-op), waits for the endpoint, and starts its ranks.
torchrun's rendezvous then holds every node until all have joined."""
from __future__ import annotations

import logging
import socket
import time
from urllib.parse import urlsplit

from backend.core.settings import get_settings
from backend.execution.agent import Claim, get_agent, unreachable
from worker.trainer.net import free_port

log = logging.getLogger(__name__)
ENDPOINT_WAIT_S = 300.0


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


def publish_endpoint(run: Claim, worker: str) -> str:
    """Node 0: record this node and the rendezvous endpoint (host:port) for the others."""
    endpoint = f"{node_address()}:{free_port('')}"  # any interface: the other nodes connect from afar
    get_agent().register_node(run.id, run.attempt, worker, endpoint)
    return endpoint


def claim_node(run_id: int, node_rank: int, worker: str) -> Claim | None:
    """Node k > 0: claim (run, attempt, k); None if the run is over or another delivery has the node. The claim's
    token (the node's, of the attempt) then writes the run's metrics beside node 0's."""
    return get_agent().claim_node(run_id, node_rank, worker)


def wait_for_endpoint(run_id: int, attempt: int) -> str | None:
    """Node k > 0: node 0's endpoint once published; None if the run ends (or moves on) first. An API that cannot
    be reached for a while (restarting) only delays the answer."""
    end = time.monotonic() + ENDPOINT_WAIT_S
    while time.monotonic() < end:
        try:
            found = get_agent().endpoint(run_id, attempt)
        except Exception as exc:
            if not unreachable(exc):
                raise
            log.warning("run %s: node 0's endpoint: the API cannot be reached (%s); asking again", run_id, exc)
            time.sleep(0.5)
            continue
        if found.address:
            return found.address
        if not found.live:
            return None
        time.sleep(0.5)
    return None


def node_heartbeat(run_id: int, attempt: int, node_rank: int) -> bool:
    """Node k > 0: record that it is alive; answers whether it must stop (the run ended, was cancelled or
    moved to another attempt, or its rows were removed by hand)."""
    return get_agent().node_heartbeat(run_id, attempt, node_rank)


def record_node_exit(run_id: int, attempt: int, node_rank: int, code: int) -> None:
    get_agent().node_exit(run_id, attempt, node_rank, code)
