"""The Celery executor: one "execute run N" message per node on the queue of the run's GPU type; a worker claims
the run in the database, so a message sent twice starts it once."""
from __future__ import annotations

from backend.core.queue import send_execute_run
from backend.executors.base import gpu_name
from backend.runs.models import Run


class CeleryExecutor:
    def submit(self, run: Run) -> None:
        send_execute_run(run.id, gpu_name(run.spec), priority=run.priority,
                         num_nodes=max(1, int(run.spec["hardware"].get("num_nodes", 1) or 1)))
