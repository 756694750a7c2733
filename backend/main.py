"""The FastAPI application: API routers plus the built dashboard (frontend/dist) at /."""
import asyncio
import logging
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from backend.api.errors import install_error_handlers
from backend.api.headers import SecurityHeaders
from backend.api.limits import RequestLimits
from backend.auth.router import router as auth_router
from backend.calibration.router import router as calibration_router
from backend.core.logs import configure_service_logging
from backend.core.settings import get_settings
from backend.execution.reaper import supervise_forever
from backend.execution.router import router as agent_router
from backend.executors import registry as executors
from backend.metrics.router import router as metrics_router
from backend.monitoring.middleware import RequestLatency
from backend.monitoring.router import router as monitoring_router
from backend.plans.router import router as plans_router
from backend.probes.router import router as probes_router
from backend.runs.router import router as runs_router
from backend.workers.router import router as workers_router

log = logging.getLogger(__name__)


def load_calibration_results() -> None:
    """gpu-check result files become measured calibration rows (idempotent: keyed by file and row)."""
    from backend.calibration.service import load_results
    from backend.core.db import session_scope

    directory = get_settings().calibration_dir
    if not directory.is_dir():
        return
    try:
        with session_scope() as session:
            n = load_results(session, directory)
        log.info("calibration: %d gpu-check rows from %s", n, directory)
    except Exception:  # a bad results file never stops the API
        log.exception("calibration: could not load %s", directory)


@asynccontextmanager
async def lifespan(app: FastAPI):
    configure_service_logging()
    await asyncio.to_thread(load_calibration_results)
    tasks = [asyncio.create_task(supervise_forever(get_settings()))]  # reaper + re-send of queued runs
    # the pollers of the executors some GPU queue uses (Slurm's follows its jobs: backend/executors/registry.py)
    tasks += [asyncio.create_task(ex.poller(get_settings())) for ex in executors.configured() if ex.poller]
    yield
    for task in tasks:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


class App(FastAPI):
    """FastAPI with the security headers outside everything, Starlette's error middleware included: a 500 carries
    them too (added as an ordinary middleware, they sit inside that one)."""

    def build_middleware_stack(self):
        return SecurityHeaders(super().build_middleware_stack())


def create_app() -> FastAPI:
    app = App(title="Ulysses Lab", version="0.1.0",
                  description="Plan, queue and watch long-context training with Ulysses sequence parallelism.",
                  lifespan=lifespan)
    install_error_handlers(app)
    app.add_middleware(RequestLimits)  # body size, UTF-8, finite numbers and depth, before any route reads a body
    app.add_middleware(RequestLatency)  # every answer timed by route, the limits' refusals included
    # SecurityHeaders wraps the whole stack (App): the limits' own 413/422 answers and any 500 carry the headers
    app.include_router(auth_router)
    app.include_router(plans_router)
    app.include_router(runs_router)
    app.include_router(probes_router)
    app.include_router(metrics_router)
    app.include_router(calibration_router)
    app.include_router(monitoring_router)
    app.include_router(workers_router)
    app.include_router(agent_router)

    @app.get("/api/health", tags=["meta"])
    async def health() -> dict:
        return {"ok": True}

    dist = get_settings().frontend_dist
    if (dist / "assets").is_dir():
        app.mount("/assets", StaticFiles(directory=dist / "assets"), name="assets")

    @app.get("/", include_in_schema=False)
    def index():
        if (dist / "index.html").is_file():
            return FileResponse(dist / "index.html")
        return JSONResponse({"detail": "the dashboard is not built: run `make run` (npm ci && npm run build "
                                       "in frontend/)"}, status_code=503)

    return app


app = create_app()
