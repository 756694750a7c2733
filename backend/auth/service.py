"""API tokens: create (shown once), verify by hash, revoke."""
from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cachetools import TTLCache
from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session

from backend.auth.models import ApiToken
from backend.auth.roles import GRANTS, Permission, Role

TOKEN_PREFIX = "ulab_"


@dataclass(frozen=True)
class Principal:
    token_id: int | None  # None: an anonymous reader (ULAB_OPEN_READS), or a run's attempt token
    name: str
    role: Role
    queues: frozenset[str] = frozenset()  # a worker token's queues
    # an attempt token's run, attempt, node and Slurm job (backend/execution/attempt_tokens.py)
    run_id: int | None = None
    attempt: int | None = None
    node_rank: int = 0
    job_id: str | None = None

    def can(self, permission: Permission) -> bool:
        return permission in GRANTS[self.role]


ANONYMOUS_READER = Principal(None, "anonymous", Role.VIEWER)


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a plain SHA-256 is enough (no password stretching needed).
    return hashlib.sha256(token.encode()).hexdigest()


def new_token(prefix: str = TOKEN_PREFIX) -> tuple[str, str]:
    """A new token (`prefix` + 256 random bits) and the SHA-256 that is all the database keeps of it: API tokens and
    browser sessions here, attempt tokens (backend/execution/attempt_tokens.py), run share links
    (backend/runs/share.py)."""
    token = prefix + secrets.token_urlsafe(32)
    return token, hash_token(token)


def queue_list(queues: str | None) -> frozenset[str]:
    return frozenset(q for q in (queues or "").split(",") if q)


def create_token(session: Session, name: str, role: Role, queues: list[str] | None = None) -> tuple[ApiToken, str]:
    """A new token of `role`; a worker token names the queues it serves (ValueError without one), no other does."""
    if (role == Role.WORKER) != bool(queues):
        raise ValueError("a worker token names the queues it serves, and only a worker token names queues")
    token, digest = new_token()
    row = ApiToken(name=name, role=role.value, token_hash=digest, prefix=token[:12],
                   queues=",".join(sorted(set(queues or []))) or None)
    session.add(row)
    session.commit()
    return row, token


# Verified tokens are remembered for a few seconds, so a busy client costs no database round trip per
# request. A revocation through this process takes effect at once; through another API process within
# VERIFIED_TTL_S.
VERIFIED_TTL_S = 5.0
_verified: TTLCache[str, Principal] = TTLCache(maxsize=10_000, ttl=VERIFIED_TTL_S)
_verified_lock = threading.Lock()  # cachetools caches are not thread-safe; routes run in a thread pool


def cached_principal(token: str) -> Principal | None:
    """The principal of a token verified in the last VERIFIED_TTL_S seconds, without a database round trip."""
    with _verified_lock:
        return _verified.get(hash_token(token))


# A browser session lasts as long as its cookie (auth/router.py sets max_age from it): after that its token is refused
# even if the cookie was kept elsewhere, and the supervision loop deletes it (purge_sessions).
SESSION_TTL_S = 30 * 24 * 3600


def _expired_session(row: ApiToken, at: datetime | None = None) -> bool:
    if row.session_of is None or row.created_at is None:
        return False
    created = row.created_at if row.created_at.tzinfo else row.created_at.replace(tzinfo=UTC)
    return created < (at or datetime.now(UTC)) - timedelta(seconds=SESSION_TTL_S)


def purge_sessions(session: Session, at: datetime | None = None) -> int:
    """Delete browser-session tokens that expired or were revoked (sign-out); answers how many."""
    cutoff = (at or datetime.now(UTC)) - timedelta(seconds=SESSION_TTL_S)
    done = session.execute(delete(ApiToken).where(ApiToken.session_of.is_not(None),
                                                  or_(ApiToken.revoked_at.is_not(None), ApiToken.created_at < cutoff)))
    session.commit()
    return int(getattr(done, "rowcount", 0) or 0)


def verify(session: Session, token: str) -> Principal | None:
    """The principal of a valid token. A browser session's token acts as the token it was opened with (same id, so
    "my runs" stay mine across sign-ins), only while that token is not revoked, and for SESSION_TTL_S."""
    principal = cached_principal(token)
    if principal is not None:
        return principal
    digest = hash_token(token)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None)))
    if row is None or _expired_session(row):
        return None
    owner = row if row.session_of is None else session.get(ApiToken, row.session_of)
    if owner is None or owner.revoked_at is not None:
        return None
    principal = Principal(owner.id, owner.name, Role(row.role), queues=queue_list(owner.queues))
    with _verified_lock:
        _verified[digest] = principal
    return principal


def open_session(session: Session, principal: Principal) -> str:
    """A token for one browser session of `principal` (kept in the cookie); sign-out revokes it."""
    token, digest = new_token()
    session.add(ApiToken(name=f"session of {principal.name}"[:200], role=principal.role.value,
                         token_hash=digest, prefix=token[:12], session_of=principal.token_id))
    session.commit()
    return token


def close_session(session: Session, token: str) -> bool:
    """Revoke a browser session's token (not the token it was opened with); answers whether one was revoked."""
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token),
                                                ApiToken.session_of.is_not(None), ApiToken.revoked_at.is_(None)))
    return row is not None and revoke(session, row.id) is not None


def token_in_file(session: Session, path: Path, name: str, role: Role, queues: list[str] | None = None
                  ) -> tuple[str, Principal]:
    """The token kept in `path` while it is valid and has `role`; else a new one, written there (mode 600). Holders
    that start again (a worker, `ulab token create --reuse`) reuse one token instead of minting one per start; a
    lock beside the file makes processes starting at once share one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            old = path.read_text().strip()
            principal = verify(session, old)
            if principal is not None and principal.role == role and principal.queues == frozenset(queues or []):
                return old, principal
        row, token = create_token(session, name, role, queues)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token, Principal(row.id, row.name, role, queues=queue_list(row.queues))


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(session: Session, token_id: int) -> ApiToken | None:
    """Revoke a token and the browser sessions opened with it."""
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        at = datetime.now(UTC)
        sessions = list(session.scalars(select(ApiToken).where(ApiToken.session_of == row.id,
                                                               ApiToken.revoked_at.is_(None))))
        for r in (row, *sessions):
            r.revoked_at = at
        session.commit()
        with _verified_lock:
            for r in (row, *sessions):
                _verified.pop(r.token_hash, None)
    return row
