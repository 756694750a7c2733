"""API tokens: create (shown once), verify by hash, revoke."""
from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.auth.models import ApiToken
from backend.auth.roles import GRANTS, Permission, Role

TOKEN_PREFIX = "ulab_"


@dataclass(frozen=True)
class Principal:
    token_id: int | None  # None: an anonymous reader (only when ULAB_OPEN_READS is on)
    name: str
    role: Role

    def can(self, permission: Permission) -> bool:
        return permission in GRANTS[self.role]


ANONYMOUS_READER = Principal(None, "anonymous", Role.VIEWER)


def hash_token(token: str) -> str:
    # Tokens carry 256 random bits, so a plain SHA-256 is enough (no password stretching needed).
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, role: Role) -> tuple[ApiToken, str]:
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, role=role.value, token_hash=hash_token(token), prefix=token[:12])
    session.add(row)
    session.commit()
    return row, token


# Verified tokens are remembered for a few seconds, so a busy client costs no database round trip per
# request. A revocation through this process takes effect at once; through another API process within
# VERIFIED_TTL_S.
VERIFIED_TTL_S = 5.0
_verified: dict[str, tuple[Principal, float]] = {}
_verified_lock = threading.Lock()


def _cached(digest: str) -> Principal | None:
    with _verified_lock:
        hit = _verified.get(digest)
    return hit[0] if hit and hit[1] > time.monotonic() else None


def cached_principal(token: str) -> Principal | None:
    """The principal of a token verified in the last VERIFIED_TTL_S seconds, without a database round trip."""
    return _cached(hash_token(token))


def verify(session: Session, token: str) -> Principal | None:
    digest = hash_token(token)
    principal = _cached(digest)
    if principal is not None:
        return principal
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest, ApiToken.revoked_at.is_(None)))
    if row is None:
        return None
    principal = Principal(row.id, row.name, Role(row.role))
    with _verified_lock:
        if len(_verified) > 10_000:  # bounded: forget everything rather than grow
            _verified.clear()
        _verified[digest] = (principal, time.monotonic() + VERIFIED_TTL_S)
    return principal


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.id)))


def revoke(session: Session, token_id: int) -> ApiToken | None:
    row = session.get(ApiToken, token_id)
    if row is not None and row.revoked_at is None:
        row.revoked_at = datetime.now(UTC)
        session.commit()
        with _verified_lock:
            _verified.pop(row.token_hash, None)
    return row
