"""Request latency by route template (`/api/runs/{run_id}`, never the raw path, so ids add no series)."""
from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.core.instruments import REQUEST_SECONDS

# A stream's latency is its lifetime, not a response time: left out.
UNTIMED = ("/api/runs/{run_id}/stream",)


class RequestLatency:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route is None:
                route = "/assets" if scope["path"].startswith("/assets/") else "unmatched"
            if route not in UNTIMED:
                REQUEST_SECONDS.labels(scope["method"], route, str(status)).observe(time.perf_counter() - start)
