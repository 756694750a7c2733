"""The FastAPI application: API routers plus the built dashboard (frontend/dist) at /."""
import asyncio
from contextlib import asynccontextmanager, suppress

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from backend.api.errors import install_error_handlers
from backend.auth.router import router as auth_router
from backend.core.settings import get_settings
from backend.metrics.router import router as metrics_router
from backend.plans.router import router as plans_router
from backend.runs.lifecycle import supervise_forever
from backend.runs.router import router as runs_router


@asynccontextmanager
async def lifespan(app: FastAPI):
    task = asyncio.create_task(supervise_forever(get_settings()))  # reaper + re-send of queued runs
    yield
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


def create_app() -> FastAPI:
    app = FastAPI(title="Ulysses Lab", version="0.1.0",
                  description="Plan, queue and watch long-context training with Ulysses sequence parallelism.",
                  lifespan=lifespan)
    install_error_handlers(app)
    app.include_router(auth_router)
    app.include_router(plans_router)
    app.include_router(runs_router)
    app.include_router(metrics_router)

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
