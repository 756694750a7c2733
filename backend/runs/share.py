"""A run's view-only share links: a token that reads one run (its plan, state, alerts, outcome, timeline and metrics)
for whoever holds the link, signed in or not. The run's owner, an approver or an admin creates one
(POST /api/runs/{id}/share) and revokes the run's links (DELETE). Only the token's SHA-256 is stored
(backend/auth/service.new_token, hash_token), as for API tokens.

A share token is no API token: `verify` of backend/auth does not know it, so every route that asks for a role
answers 401 to it. Only the routes that take `RunReader` read it, and only for the run it was made for (403 for
another). The browser sends it as `Authorization: Bearer ulab_share_...`, or as `?share=` where a header cannot go
(the live stream's EventSource, a download link)."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import DateTime, ForeignKey, Integer, String, func, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from backend.api.deps import RowId
from backend.auth.deps import presented_token, requires
from backend.auth.roles import Permission, Role
from backend.auth.service import Principal, hash_token, new_token
from backend.core.db import Base, get_sessionmaker
from backend.core.errors import UserError
from backend.runs import transitions

PREFIX = "ulab_share_"
QUERY = "share"  # the query parameter that carries the token where no header can
DEFAULT_DAYS = 30


class RunShare(Base):
    __tablename__ = "run_shares"

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(24))  # the token's start, to tell links apart in a list
    created_by: Mapped[int | None] = mapped_column(Integer, nullable=True)  # api_tokens.id
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


def create(session: Session, run_id: int, by: Principal, days: int = DEFAULT_DAYS) -> tuple[RunShare, str]:
    """A new share token of the run, valid for `days`: the row (committed) and the token, which is not stored."""
    token, digest = new_token(PREFIX)
    row = RunShare(run_id=run_id, token_hash=digest, prefix=token[:len(PREFIX) + 6], created_by=by.token_id,
                   expires_at=transitions.now() + timedelta(days=days))
    session.add(row)
    session.commit()
    return row, token


def live(session: Session, run_id: int) -> list[RunShare]:
    """The run's share links that still open it (not revoked, not expired), oldest first."""
    return list(session.scalars(select(RunShare).where(RunShare.run_id == run_id, RunShare.revoked_at.is_(None),
                                                       RunShare.expires_at > transitions.now())
                                .order_by(RunShare.id)))


def revoke(session: Session, run_id: int) -> int:
    """Revoke every live share link of the run; answers how many."""
    rows = live(session, run_id)
    at = transitions.now()
    for row in rows:
        row.revoked_at = at
    session.commit()
    return len(rows)


def verify(session: Session, token: str) -> Principal | None:
    """The reader a live share token stands for (role viewer, scoped to its run), or None."""
    row = session.scalar(select(RunShare).where(RunShare.token_hash == hash_token(token),
                                                RunShare.revoked_at.is_(None)))
    if row is None or transitions.as_utc(row.expires_at) <= transitions.now():
        return None
    return Principal(None, f"share link {row.prefix}… of run {row.run_id}", Role.VIEWER, run_id=row.run_id)


def _verify_in_database(token: str) -> Principal | None:
    with get_sessionmaker()() as session:
        return verify(session, token)


def shared_token(request: Request) -> str | None:
    """The share token a request presents (a bearer header, else the `share` query parameter), or None."""
    token = presented_token(request)
    if token is not None and token.startswith(PREFIX):
        return token
    query = request.query_params.get(QUERY)
    return query if query and query.startswith(PREFIX) else None


async def run_reader(request: Request, run_id: RowId) -> Principal:
    """Who reads run `run_id`: a share token of that run (401 if it is unknown, revoked or expired; 403 for another
    run's), else any principal that may read (backend/auth/deps.requires)."""
    token = shared_token(request)
    if token is None:
        return await requires(Permission.READ)(request)
    principal = await run_in_threadpool(_verify_in_database, token)
    if principal is None:
        raise UserError(401, "authorization", "the share link is unknown, revoked or expired")
    if principal.run_id != run_id:
        raise UserError(403, "authorization", f"this share link opens run {principal.run_id} only")
    return principal


RunReader = Annotated[Principal, Depends(run_reader)]
