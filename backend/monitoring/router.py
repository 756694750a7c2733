"""GET /metrics: the Prometheus exposition, read-protected like the other reads (a scrape sends a viewer token as
`Authorization: Bearer`; with ULAB_OPEN_READS it needs none)."""
from __future__ import annotations

import os

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

from backend.auth.deps import Reader
from backend.monitoring.collector import RunsCollector

router = APIRouter(tags=["meta"])
_runs = RunsCollector()
REGISTRY.register(_runs)  # once per process: this module is imported once


def exposition() -> bytes:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return generate_latest(REGISTRY)  # this process's counters, Python's own, and the database's figures
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # every API process's counters, summed
    registry.register(_runs)
    return generate_latest(registry)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}})
async def metrics(_: Reader) -> Response:
    """Prometheus metrics of the service: runs by state and queue, queue wait, metric points ingested, SSE clients,
    request latency by route, re-sent and reaped runs."""
    return Response(await run_in_threadpool(exposition), media_type=CONTENT_TYPE_LATEST)
