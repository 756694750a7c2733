"""The API's side of the task queue: it sends "execute run N" by task name, so the backend never imports the
worker. The worker's Celery app (worker/celery_app.py) takes the name, the queue naming and the broker
settings from here, so both ends agree on them.

Broker: Redis when ULAB_BROKER_URL is set, else kombu's SQLAlchemy transport on a SQLite file under ULAB_HOME.
"""
from __future__ import annotations

import re
from functools import lru_cache

from celery import Celery

from backend.core.settings import Settings, get_settings
from plan.model import Plan

EXECUTE_RUN = "ulab.execute_run"
# A multi-day run must never be redelivered while it runs (Redis redelivers unacknowledged messages after
# the visibility timeout); the database claim stops a second start anyway, this avoids the noise.
VISIBILITY_TIMEOUT_S = 30 * 24 * 3600


QUEUE_NAME = r"^gpu-[a-z0-9-]{1,60}$"  # what queue_for makes of a GPU type's name


def queue_for(gpu_name: str) -> str:
    """The queue of a GPU type: `gpu-h100-80gb` for H100-80GB."""
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def gpu_name(spec: dict) -> str:
    """The GPU type a plan not validated yet names (`hardware.gpu`: a catalog name, or a custom GPU's name): its
    queue's. Only for the user's own file (`ulab plan --from-workers`, which may recommend a partial plan); a stored
    or validated plan's is `plan_gpu_name(run.plan)`."""
    gpu = spec.get("hardware", {}).get("gpu", "")
    return gpu.get("name", "custom") if isinstance(gpu, dict) else str(gpu)


def plan_gpu_name(plan: Plan) -> str:
    """The GPU type a validated plan names: its queue's."""
    gpu = plan.hardware.gpu
    return gpu if isinstance(gpu, str) else gpu.name


def broker_url(settings: Settings) -> str:
    """The broker URL; for the embedded SQLite broker, its directory is created first."""
    if not settings.broker_url:
        settings.home.mkdir(parents=True, exist_ok=True)
    return settings.resolved_broker_url


def broker_config(url: str) -> dict:
    """Celery settings both the producer and the worker use."""
    return dict(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # Redis only: the SQLAlchemy transport hands these to create_engine, which refuses them.
        broker_transport_options=({"visibility_timeout": VISIBILITY_TIMEOUT_S, "queue_order_strategy": "priority"}
                                  if url.startswith(("redis", "rediss")) else {}),
        broker_connection_retry_on_startup=True,
    )


@lru_cache
def _producer(url: str) -> Celery:
    """A Celery app that only sends (no tasks of its own); not made the process's current app."""
    app = Celery("ulab-api", broker=url, set_as_current=False)
    app.conf.update(broker_config(url))
    return app


def send_execute_run(run_id: int, gpu_name: str, priority: int = 0, num_nodes: int = 1) -> None:
    """One message per node of the run (a gang for multi-node runs), on the queue of its GPU type. Our priority
    is 0-9, higher first; Celery's Redis transport serves lower numbers first, hence 9 - priority."""
    app = _producer(broker_url(get_settings()))
    for node_rank in range(num_nodes):
        app.send_task(EXECUTE_RUN, args=[run_id, node_rank], queue=queue_for(gpu_name), priority=9 - priority)


def workers_on(queue: str, timeout_s: float = 1.0) -> int | None:
    """How many Celery workers consume `queue` (those that answer a broadcast within `timeout_s`); None where the
    broker cannot broadcast (the embedded SQLite transport), so nobody can tell."""
    app = _producer(broker_url(get_settings()))
    try:
        with app.connection_for_write() as conn:
            if not getattr(conn.default_channel, "supports_fanout", False):
                return None
        replies = app.control.inspect(timeout=timeout_s).active_queues() or {}
    except Exception:  # a broker that does not answer: nobody can tell either
        return None
    return sum(1 for queues in replies.values() if any(q.get("name") == queue for q in queues or []))
