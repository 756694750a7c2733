"""The Celery app. It carries only "execute run N"; the database holds the run's state.

Broker: Redis when ULAB_BROKER_URL is set, else kombu's SQLAlchemy transport on a SQLite file.
One task at a time per worker (prefetch 1, concurrency 1), acknowledged late; the run is claimed in the
database before anything starts, so a redelivered message cannot start a run twice.
"""
from __future__ import annotations

import re

from celery import Celery

from backend.core.settings import get_settings

EXECUTE_RUN = "ulab.execute_run"
# A multi-day run must never be redelivered while it runs (Redis redelivers unacknowledged messages after
# the visibility timeout); the database claim stops a second start anyway, this avoids the noise.
VISIBILITY_TIMEOUT_S = 30 * 24 * 3600


def queue_for(gpu_name: str) -> str:
    """The queue of a GPU type: `gpu-h100-80gb` for H100-80GB."""
    return "gpu-" + re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-")


def make_celery() -> Celery:
    settings = get_settings()
    if not settings.broker_url:
        (settings.home).mkdir(parents=True, exist_ok=True)
    app = Celery("ulab", broker=settings.resolved_broker_url, include=["worker.tasks"])
    app.conf.update(
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # Redis only: the SQLAlchemy transport hands these to create_engine, which refuses them.
        broker_transport_options=({"visibility_timeout": VISIBILITY_TIMEOUT_S, "queue_order_strategy": "priority"}
                                  if settings.resolved_broker_url.startswith(("redis", "rediss")) else {}),
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_default_queue=queue_for(settings.gpu_type),
    )
    return app


celery_app = make_celery()


def send_execute_run(run_id: int, gpu_name: str, priority: int = 0, num_nodes: int = 1) -> None:
    """One message per node of the run (a gang for multi-node runs). Our priority is 0-9, higher first;
    Celery's Redis transport serves lower numbers first, hence 9 - priority."""
    for node_rank in range(num_nodes):
        celery_app.send_task(EXECUTE_RUN, args=[run_id, node_rank], queue=queue_for(gpu_name), priority=9 - priority)


def start_worker(gpu_type: str | None, gpus: int, loglevel: str = "info") -> None:
    """`ulab worker`: consume the queue of one GPU type, or every catalog GPU's queue when none is given."""
    if gpu_type:
        queues = [queue_for(gpu_type)]
    else:
        from backend.planner import catalog

        queues = [queue_for(g["name"]) for g in catalog()["gpus"]]
    celery_app.conf.ulab_gpus = gpus
    celery_app.worker_main(["worker", "--pool", "solo", "--concurrency", "1", "--loglevel", loglevel,
                            "--queues", ",".join(queues), "--without-gossip", "--without-mingle"])
