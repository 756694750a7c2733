"""The Celery side of the Celery executor: one "execute run N" message per node on the queue of the run's GPU type;
a worker claims the run in the database, so a message sent twice starts it once."""
from __future__ import annotations

from backend.core.queue import send_execute_run


def send(run_id: int, gpu: str, priority: int, num_nodes: int) -> None:
    send_execute_run(run_id, gpu, priority=priority, num_nodes=num_nodes)
