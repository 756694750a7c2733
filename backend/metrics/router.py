"""HTTP: a run's metric ingest in batches (its alerts raised on the way, backend/alerts/service.py), the bucketed chart
query (backend/metrics/), the CSV export, and the live Server-Sent Events stream."""
import asyncio
import csv
import io
import json
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select
from sse_starlette.sse import EventSourceResponse

from backend.alerts import service as alerts
from backend.api.deps import RowId, SessionDep
from backend.auth.deps import presented_token, requires
from backend.auth.roles import Permission, Role
from backend.auth.service import Principal
from backend.core.db import get_sessionmaker
from backend.core.instruments import POINTS_INGESTED, SSE_CLIENTS
from backend.core.settings import get_settings
from backend.execution import attempt_tokens
from backend.execution.router import attempt_principal
from backend.metrics import chart, service
from backend.metrics.models import MetricPoint
from backend.metrics.schemas import Accepted, MetricQueryOut, PointsIn, StepAxesOut
from backend.runs import share
from backend.runs.schemas import RunOut
from backend.runs.service import get_run, require_run, require_writable_run
from backend.runs.share import RunReader
from backend.runs.states import TERMINAL, RunState

router = APIRouter(prefix="/api/runs/{run_id}", tags=["metrics"])
POLL_S = 0.25  # how often the stream looks for new rows; a point reaches the page within this + shipping


async def metrics_writer(request: Request) -> Principal:
    """A worker's attempt token (backend/execution/attempt_tokens.py), or an API token that may ingest (an admin's)."""
    token = presented_token(request)
    if token is not None and token.startswith(attempt_tokens.PREFIX):
        return await attempt_principal(request)
    return await requires(Permission.INGEST)(request)


@router.post("/metrics")
def ingest(run_id: RowId, body: PointsIn, session: SessionDep,
           by: Annotated[Principal, Depends(metrics_writer)]) -> Accepted:
    """Store a batch of points; idempotent on (run, rank, step, name), so the worker may resend. A worker writes
    only the runs it claimed; nobody writes a run that ended over a minute ago (409)."""
    run = require_writable_run(session, run_id, by)
    if body.first_step is not None and by.role == Role.WORKER and run.attempt_first_step != body.first_step:
        run.attempt_first_step = body.first_step  # committed with the points
    if body.points:
        alerts.check(session, run_id, body.points, body.file_started)  # committed with the points
    accepted = service.ingest(session, run_id, body.points, attempt=run.attempt)
    POINTS_INGESTED.inc(accepted)
    return Accepted(accepted=accepted)


EXPORT_COLUMNS = ("step", "rank", "name", "value", "wall_time")


def _export_rows(session, run_id: int):
    """Every stored point of the run, in step, name, rank order (one row per point: pivot on name for a wide table)."""
    return session.execute(select(MetricPoint.step, MetricPoint.rank, MetricPoint.name, MetricPoint.value,
                                  MetricPoint.wall_time).where(MetricPoint.run_id == run_id)
                           .order_by(MetricPoint.step, MetricPoint.name, MetricPoint.rank)).all()


@router.get("/metrics.csv", response_class=Response,
            responses={200: {"content": {"text/csv": {}}, "description": "step,rank,name,value,wall_time"}})
def metrics_csv(run_id: RowId, session: SessionDep, _: RunReader) -> Response:
    """Every stored point of the run as CSV (step, rank, name, value, wall_time: unix seconds)."""
    require_run(session, run_id)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    writer.writerows(_export_rows(session, run_id))
    return Response(out.getvalue(), media_type="text/csv",
                    headers={"Content-Disposition": f'attachment; filename="run-{run_id}-metrics.csv"'})


@router.get("/metrics.parquet", response_class=Response,
            responses={200: {"content": {"application/vnd.apache.parquet": {}}, "description": "the same as Parquet"}})
def metrics_parquet(run_id: RowId, session: SessionDep, _: RunReader) -> Response:
    """Every stored point of the run as Parquet, the columns of metrics.csv with their types."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_run(session, run_id)
    rows = _export_rows(session, run_id)
    types = (pa.int64(), pa.int32(), pa.string(), pa.float64(), pa.float64())
    table = pa.table({c: pa.array([r[i] for r in rows], type=t) for i, (c, t) in enumerate(zip(EXPORT_COLUMNS,
                                                                                                 types, strict=True))})
    out = io.BytesIO()
    pq.write_table(table, out)
    return Response(out.getvalue(), media_type="application/vnd.apache.parquet",
                    headers={"Content-Disposition": f'attachment; filename="run-{run_id}-metrics.parquet"'})


@router.get("/metrics/names")
def metric_names(run_id: RowId, session: SessionDep, _: RunReader) -> list[str]:
    require_run(session, run_id)
    return service.names(session, run_id)


@router.get("/metrics", response_model=MetricQueryOut)
async def query(run_id: RowId, _: RunReader, name: str = Query(..., min_length=1, max_length=64),
                start: int | None = Query(None, ge=0, le=2**31 - 1), end: int | None = Query(None, ge=0, le=2**31 - 1),
                points: int = Query(1000, ge=1, le=10_000)) -> Response:
    """At most `points` buckets per rank over the step range, each with min, max and last; the chart of a live run
    may be up to ULAB_CHART_CACHE_S behind its ingest (backend/metrics/chart.py). A fresh answer is served on the
    event loop, with no database session; the rest run in the thread pool."""
    key = (run_id, name, start, end, points)
    if (answer := chart.ANSWERS.fresh(key)) is None:
        def compute() -> bytes:  # an answer served again needs no query: its run was there when it was computed
            with get_sessionmaker()() as session:
                require_run(session, run_id)
                return chart.query(session, run_id, name, start, end, points).model_dump_json().encode()

        answer = await run_in_threadpool(chart.ANSWERS.get, key, get_settings().chart_cache_s, compute)
    return Response(answer, media_type="application/json")


@router.get("/metrics/axes")
def step_axes(run_id: RowId, session: SessionDep, _: RunReader,
              points: int = Query(1000, ge=2, le=10_000)) -> StepAxesOut:
    """The run's steps with their wall time and the tokens trained up to them (at most `points`), for charts whose
    x axis is wall time or tokens."""
    require_run(session, run_id)
    return chart.axes(session, run_id, points)


def _snapshot(run_id: int, cursor: int | None, shared: str | None = None) -> tuple[dict, int, list[dict]] | None:
    """The run, the new cursor and the points after `cursor`; None once the share token the stream was opened with
    (`shared`) no longer opens the run (revoked, expired)."""
    with get_sessionmaker()() as session:
        if shared is not None and share.verify(session, shared) is None:
            return None
        run = RunOut.model_validate(get_run(session, run_id)).model_dump(mode="json")
        if cursor is None:  # the stream starts now; history comes from the chart query
            # the newest id of any run: an index end point, and every later point of this run is above it
            newest = session.scalar(select(func.coalesce(func.max(MetricPoint.id), 0)))
            return run, int(newest or 0), []
        cursor, points = service.points_after(session, run_id, cursor)
        return run, cursor, points


@router.get("/stream")
async def stream(run_id: RowId, request: Request, session: SessionDep, by: RunReader) -> EventSourceResponse:
    """Server-Sent Events: `state` (the run, first and on every change) and `metrics` (new points). A stream opened
    with a share link's token ends when the link is revoked or expires."""
    get_run(session, run_id)
    session.close()
    shared = share.shared_token(request) if by.run_id is not None else None

    async def events():
        with SSE_CLIENTS.track_inprogress():  # counted while the generator runs (a disconnect closes it)
            async for event in _events(run_id, request, shared):
                yield event

    return EventSourceResponse(events(), ping=15)


async def _events(run_id: int, request: Request, shared: str | None):
    first = await run_in_threadpool(_snapshot, run_id, None, shared)
    if first is None:
        return
    run, cursor, _ = first
    last_sent = run
    yield {"event": "state", "data": json.dumps(run)}
    while not await request.is_disconnected():
        got = await run_in_threadpool(_snapshot, run_id, cursor, shared)
        if got is None:
            return
        run, cursor, points = got
        if points:
            yield {"event": "metrics", "data": json.dumps({"points": points})}
        if {k: v for k, v in run.items() if k != "heartbeat_at"} != \
           {k: v for k, v in last_sent.items() if k != "heartbeat_at"}:
            last_sent = run
            yield {"event": "state", "data": json.dumps(run)}
        if RunState(run["state"]) in TERMINAL and not points:
            await asyncio.sleep(POLL_S * 8)  # a finished run: keep the connection, look rarely
        else:
            await asyncio.sleep(POLL_S)
