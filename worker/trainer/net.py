"""Network helpers the trainer and the worker share (the trainer imports nothing of the backend)."""
from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it; "" means every interface)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
