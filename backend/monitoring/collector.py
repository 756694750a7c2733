"""Figures read from the database at each scrape, so they are right whichever API process answers and across
restarts: runs by state and queue, how long the oldest queued run of each queue has waited, and the queue wait
(queued -> started) of every run that started, as a histogram."""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from backend.core.db import get_sessionmaker
from backend.core.queue import queue_for
from backend.runs.models import Run
from backend.runs.states import RunState

# A run waits seconds on an idle worker, hours behind a long run on the same GPUs.
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _queue(gpu: str | None) -> str:
    """The Celery queue of a run's GPU (a custom GPU object is stored as JSON: its queue is gpu-custom)."""
    return queue_for(gpu if gpu and not gpu.startswith("{") else "custom")


class RunsCollector(Collector):
    def describe(self) -> Iterator[Metric]:
        """The families without samples: registering the collector then reads no database (prometheus_client
        calls collect() to learn the names of a collector without describe())."""
        yield GaugeMetricFamily("ulab_runs", "", labels=["state", "queue"])
        yield GaugeMetricFamily("ulab_queue_oldest_wait_seconds", "", labels=["queue"])
        yield HistogramMetricFamily("ulab_queue_wait_seconds", "")

    def collect(self) -> Iterator[Metric]:
        gpu = Run.spec["hardware"]["gpu"].as_string()
        with get_sessionmaker()() as s:
            counts = s.execute(select(Run.state, gpu, func.count()).group_by(Run.state, gpu)).all()
            queued = s.execute(select(gpu, func.min(Run.queued_at)).where(Run.state == RunState.QUEUED.value)
                               .group_by(gpu)).all()
            waits = s.execute(select(Run.queued_at, Run.started_at).where(Run.started_at.is_not(None),
                                                                          Run.queued_at.is_not(None))).all()
        runs = GaugeMetricFamily("ulab_runs", "Runs by state and queue", labels=["state", "queue"])
        by: Counter[tuple[str, str]] = Counter()
        for state, name, n in counts:
            by[(state, _queue(name))] += n
        for (state, queue), n in sorted(by.items()):
            runs.add_metric([state, queue], n)
        yield runs
        now = datetime.now(UTC)
        oldest = GaugeMetricFamily("ulab_queue_oldest_wait_seconds", "How long the oldest queued run of each queue "
                                                                      "has waited", labels=["queue"])
        for name, at in queued:
            if at is not None:
                oldest.add_metric([_queue(name)], max(0.0, (now - _utc(at)).total_seconds()))
        yield oldest
        seconds = [max(0.0, (_utc(started) - _utc(q)).total_seconds()) for q, started in waits if q and started]
        buckets = [(str(b), sum(1 for w in seconds if w <= b)) for b in WAIT_BUCKETS] + [("+Inf", len(seconds))]
        yield HistogramMetricFamily("ulab_queue_wait_seconds", "Queue wait (queued -> started) of the runs that "
                                                               "started (each run's latest attempt)",
                                    buckets=buckets, sum_value=sum(seconds))
