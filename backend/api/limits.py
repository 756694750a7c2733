"""Limits on request bodies, checked before any route reads one: size (413), and for JSON bodies strict UTF-8,
finite numbers and nesting depth (422 naming the field; backend/core/text.py). A pure ASGI middleware, so streamed
responses (the SSE stream) pass through untouched."""
from __future__ import annotations

import re
import sys

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backend.core.settings import get_settings
from backend.core.text import UnstorableValue, read_json, storable_json_error

# Metric batches from workers may be larger than any other body.
_INGEST_PATH = re.compile(r"^/api/runs/[^/]+/metrics/?$")
# What the decoded value must be walked for: a surrogate escape, a non-finite literal, an exponent of 3+ digits or a
# run of digits past Python's int limit. Raw UTF-8 cannot hold a surrogate (the strict decode refuses it), so a body
# without these needs no walk for them.
_SUSPECT = re.compile(rb"\\u[dD][89a-fA-F]|NaN|Infinity|[eE][+-]?[0-9]{3}|[0-9]{%d}"
                      % (sys.get_int_max_str_digits() + 1))
# The body as read, kept in the request's scope for the answer to a body the route could not parse
# (backend/api/errors.py): FastAPI says only "There was an error parsing the body".
BODY_KEY = "ulab.body"


def _error(status: int, field: str, message: str) -> JSONResponse:
    return JSONResponse({"detail": [{"field": field, "message": message}]}, status_code=status)


def _is_json(scope: Scope) -> bool:
    """FastAPI reads a body as JSON when its content type says so, or says nothing."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return b"json" in value.lower()
    return True


class BodyTooLarge(Exception):
    pass


class RequestLimits:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        ingest = scope["method"] == "POST" and _INGEST_PATH.match(scope["path"]) is not None
        settings = get_settings()
        limit = settings.max_ingest_body_bytes if ingest else settings.max_body_bytes
        too_large = _error(413, "body", f"the request body is larger than {limit:,} bytes "
                                        "(ULAB_MAX_BODY_BYTES, ULAB_MAX_INGEST_BODY_BYTES for metric batches)")
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await too_large(scope, receive, send)
            return
        try:
            body, last = await self._read(receive, limit)
        except BodyTooLarge:
            await too_large(scope, receive, send)
            return
        # A metric batch is typed through and through (backend/metrics/schemas.py: its strings refuse lone
        # surrogates, its numbers non-finite values; a body the route cannot parse is answered by
        # json_body_problem), and scanning a 5,000-point batch would cost the API 10-30 ms of Python: it gets the
        # size limit only.
        if body and _is_json(scope):
            scope[BODY_KEY] = body
        if body and not ingest and _is_json(scope):
            problem = self._check_json(body)
            if problem is not None:
                await problem(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:  # the body once, then the client's own messages (a disconnect)
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive() if last["type"] != "http.disconnect" else last

        await self.app(scope, replay, send)

    @staticmethod
    async def _read(receive: Receive, limit: int) -> tuple[bytes, Message]:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks), message
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), message

    @staticmethod
    def _check_json(body: bytes) -> JSONResponse | None:
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as e:
            return _error(422, "body", f"the request body is not valid UTF-8 (byte {e.start})")
        deep = body.count(b"{") + body.count(b"[") > get_settings().max_json_depth
        if not deep and not _SUSPECT.search(body):
            return None  # nothing the walk could find: the route parses it as it would anyway
        error = json_body_problem(body)
        return None if error is None else _error(422, error.field, error.message)


def json_body_problem(body: bytes) -> UnstorableValue | None:
    """Why a JSON body cannot be read or stored (its field: nesting, an integer past the digit limit, a non-finite
    number, a lone surrogate), or None (also for text that is not JSON: the route's parser names the position)."""
    depth = get_settings().max_json_depth
    try:
        value = read_json(body)
    except RecursionError:  # past about 1,000 levels
        return UnstorableValue("body", f"the request body is nested deeper than {depth} levels")
    except ValueError:
        return None
    return storable_json_error(value, max_depth=depth)
