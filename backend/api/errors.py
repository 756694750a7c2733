"""The handlers that answer errors a user can cause (backend/core/errors.py) as 4xx with the field and the reason:
{"detail": [{"field", "message"}]}."""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException

from backend.api.limits import BODY_KEY, json_body_problem
from backend.core.errors import IllegalTransition, UserError
from backend.core.text import UnstorableValue
from plan.errors import FieldError, field_errors

_SOURCES = ("body", "query", "path", "header", "cookie")


def _body_model(request: Request) -> type[BaseModel] | None:
    """The pydantic model of the route's body (so an unknown key can be answered with the closest known one)."""
    body = getattr(request.scope.get("route"), "body_field", None)
    annotation = getattr(getattr(body, "field_info", None), "annotation", None)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def request_errors(request: Request, errors: list) -> list[FieldError]:
    """FastAPI's validation errors in our shape, through the plan's one converter (plan/errors.py)."""
    out: list[FieldError] = []
    for e in errors:
        loc = tuple(e.get("loc", ()))
        source = loc[0] if loc and loc[0] in _SOURCES else None
        root = _body_model(request) if source == "body" else None
        out += field_errors([{**e, "loc": loc[1:] if source else loc}], root, root_label=source or "request")
    return out


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(UserError)
    async def _user_error(_: Request, exc: UserError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        # the framework's own refusals, each naming what it refers to: a body the route could not parse (why, with
        # its field, from the body itself), a path or a method with no route
        field = {404: "path", 405: "method"}.get(exc.status_code, "request")
        body = request.scope.get(BODY_KEY)
        if exc.status_code == 400 and body is not None:
            if (problem := json_body_problem(body)) is not None:
                return JSONResponse({"detail": [{"field": problem.field, "message": problem.message}]},
                                    status_code=422)
            field = "body"
        return JSONResponse({"detail": [{"field": field, "message": str(exc.detail)}]}, status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(IllegalTransition)
    async def _illegal(_: Request, exc: IllegalTransition) -> JSONResponse:
        return JSONResponse({"detail": [{"field": "state", "message": str(exc)}]}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": request_errors(request, list(exc.errors()))}, status_code=422)

    @app.exception_handler(UnstorableValue)
    async def _unstorable_value(_: Request, exc: UnstorableValue) -> JSONResponse:
        # The database session refused to write a value it could not read back (backend/core/db.py)
        return JSONResponse({"detail": [{"field": exc.field, "message": exc.message}]}, status_code=422)

    @app.exception_handler(DataError)
    async def _unstorable(_: Request, exc: DataError) -> JSONResponse:
        # A value the schemas let through but PostgreSQL refuses (a NUL character in a query parameter, say):
        # the request is at fault, not the server.
        reason = str(getattr(exc, "orig", exc)).splitlines()[0]
        return JSONResponse({"detail": [{"field": "request", "message": f"the database refuses a value of this "
                                                                        f"request: {reason}"}]}, status_code=422)
