"""Errors a user can cause, answered as 4xx with the field and the reason: {"detail": [{"field", "message"}]}."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from backend.runs.states import IllegalTransition


class UserError(Exception):
    def __init__(self, status: int, field: str, message: str, extra: list[dict] | None = None):
        super().__init__(message)
        self.status = status
        self.detail = [{"field": field, "message": message}] + (extra or [])

    @classmethod
    def many(cls, status: int, errors: list[dict]) -> "UserError":
        first, *rest = errors
        return cls(status, first["field"], first["message"], rest)


class NotFound(UserError):
    def __init__(self, what: str, ident: int):
        super().__init__(404, "id", f"{what} {ident} does not exist")


def _field_of(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(UserError)
    async def _user_error(_: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(IllegalTransition)
    async def _illegal(_: Request, exc: IllegalTransition) -> JSONResponse:
        return JSONResponse({"detail": [{"field": "state", "message": str(exc)}]}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = [{"field": _field_of(tuple(e.get("loc", ()))), "message": e.get("msg", "invalid")}
                  for e in exc.errors()]
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(DataError)
    async def _unstorable(_: Request, exc: DataError) -> JSONResponse:
        # A value the schemas let through but PostgreSQL refuses (a NUL character in a query parameter, say):
        # the request is at fault, not the server.
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return JSONResponse({"detail": [{"field": "request", "message": f"the database refuses a value of this "
                                                                        f"request: {reason}"}]}, status_code=422)
