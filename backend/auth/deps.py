"""Who may call a route, as typed dependencies (Reader, Submitter, Approver, Admin, Agent): the request's
token (a bearer header or the browser's cookie), verified and checked for the permission."""
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from backend.auth.roles import Permission
from backend.auth.service import ANONYMOUS_READER, Principal, cached_principal, verify
from backend.core.db import get_sessionmaker
from backend.core.errors import UserError
from backend.core.settings import get_settings

COOKIE = "ulab_token"


def presented_token(request: Request) -> str | None:
    """The token of a request: `Authorization: Bearer ...` (scripts, workers) or the httpOnly cookie (browser)."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.cookies.get(COOKIE) or None


def verify_in_database(token: str) -> Principal | None:
    with get_sessionmaker()() as session:
        return verify(session, token)


def requires(permission: Permission):
    # async, and no session unless the token is not in the verified cache: a busy client's request costs no
    # thread-pool hop and no database round trip for its authorization
    async def dependency(request: Request) -> Principal:
        token = presented_token(request)
        if token is None:
            if permission == Permission.READ and get_settings().open_reads:
                return ANONYMOUS_READER
            raise UserError(401, "authorization", "sign in: send an API token (Authorization: Bearer ...)")
        principal = cached_principal(token) or await run_in_threadpool(verify_in_database, token)
        if principal is None:
            raise UserError(401, "authorization", "the API token is unknown or revoked")
        if not principal.can(permission):
            raise UserError(403, "authorization", f"role '{principal.role}' may not {permission.value}")
        return principal

    return dependency


Reader = Annotated[Principal, Depends(requires(Permission.READ))]
Submitter = Annotated[Principal, Depends(requires(Permission.SUBMIT))]
Approver = Annotated[Principal, Depends(requires(Permission.APPROVE))]
Admin = Annotated[Principal, Depends(requires(Permission.ADMIN))]
Agent = Annotated[Principal, Depends(requires(Permission.AGENT))]  # a worker's own token
