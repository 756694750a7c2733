"""Security headers on every response: no MIME sniffing, no framing (clickjacking), no referrer to other sites; and
on the dashboard's pages a Content-Security-Policy that lets them load only this origin's scripts and talk only to
this API. The API's own docs pages (/docs, /redoc) load Swagger UI from a CDN, so they get no CSP."""
from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COMMON = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"}
# style-src allows inline styles: React and uPlot size bars and charts through style attributes.
DASHBOARD_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                 "connect-src 'self'; object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'")
_NO_CSP = ("/api/", "/docs", "/redoc", "/openapi.json")


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        dashboard = not scope["path"].startswith(_NO_CSP)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in COMMON.items():
                    headers.setdefault(name, value)
                if dashboard:
                    headers.setdefault("Content-Security-Policy", DASHBOARD_CSP)
            await send(message)

        await self.app(scope, receive, with_headers)
