"""The Celery app. It carries only "execute run N"; the database holds the run's state.

Broker, task name and queue names come from backend/core/queue.py, the API's side of the queue (the API sends
by name and never imports this module), through the seam (backend/execution/agent.py). One task at a time per worker
(prefetch 1, concurrency 1), acknowledged late; the run is claimed in the database before anything starts, so a
redelivered message cannot start a run twice.
"""
from __future__ import annotations

import logging
import threading

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from backend.core.settings import get_settings
from backend.execution.agent import broker_config, broker_url, get_agent, queue_for


def make_celery() -> Celery:
    settings = get_settings()
    url = broker_url(settings)
    app = Celery("ulab", broker=url, include=["worker.tasks"])
    app.conf.update(
        broker_config(url),
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        worker_hijack_root_logger=False,
        task_default_queue=queue_for(settings.gpu_type),
    )
    return app


celery_app = make_celery()
log = logging.getLogger(__name__)


def start_worker(gpu_type: str | None, gpus: int, loglevel: str = "info") -> None:
    """`ulab worker`: consume the queue of one GPU type, or every catalog GPU's queue when none is given."""
    if gpu_type:
        queues = [queue_for(gpu_type)]
    else:
        from plan import catalog  # (not `from plan.catalog import gpus`: that would shadow the GPU count)

        queues = [queue_for(name) for name in catalog.gpus()]
    celery_app.conf.ulab_gpus = gpus
    celery_app.worker_main(["worker", "--pool", "solo", "--concurrency", "1", "--loglevel", loglevel,
                            "--queues", ",".join(queues), "--without-gossip", "--without-mingle"])


@worker_ready.connect
def report_capabilities(sender=None, **_) -> None:
    """At start: this worker's library versions, attention kernels and GPU model (trainer/capabilities.py), shown at
    GET /api/workers and checked when a run of its queue is approved. A failure to report is logged, not fatal.
    The last-words files that killed workers left behind are removed first (worker/supervise.py)."""
    from worker.supervise import remove_stale_last_words

    try:
        for path in remove_stale_last_words():
            log.info("removed %s: its worker no longer runs", path)
    except OSError:
        log.warning("could not look for stale last-words files", exc_info=True)
    try:
        from worker.trainer.capabilities import capabilities

        queues = sorted(q.name for q in sender.task_consumer.queues)
        get_agent().worker_started(sender.hostname, queues, capabilities())
    except Exception:
        log.exception("could not report this worker's capabilities")
    threading.Thread(target=_heartbeats, args=(sender.hostname,), name="worker-heartbeat", daemon=True).start()


def _heartbeats(name: str) -> None:
    """While this process lives: workers.heartbeat_at every worker_heartbeat_s (a thread: the solo pool's main thread
    waits on the run it executes). A worker killed without its shutdown report stops writing it, and
    GET /api/workers shows it `lost` once the last is older than worker_lost_after_s."""
    every = get_settings().worker_heartbeat_s
    while not _STOPPING.wait(every):
        try:
            get_agent().worker_heartbeat(name)
        except Exception:  # a database hiccup: the next beat tries again
            log.warning("could not write this worker's heartbeat", exc_info=True)


_STOPPING = threading.Event()


@worker_shutdown.connect
def report_stopped(sender=None, **_) -> None:
    _STOPPING.set()
    try:
        get_agent().worker_stopped(sender.hostname)
    except Exception:
        log.exception("could not report this worker's shutdown")
