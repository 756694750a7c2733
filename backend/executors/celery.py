"""The Celery side of the Celery executor: one "execute run N" message per node on the queue of the run's GPU type;
a worker claims the run in the database, so a message sent twice starts it once."""
from __future__ import annotations

from backend.core.queue import gpu_name, send_execute_run


def send(run_id: int, spec: dict, priority: int) -> None:
    send_execute_run(run_id, gpu_name(spec), priority=priority,
                     num_nodes=max(1, int(spec["hardware"].get("num_nodes", 1) or 1)))
