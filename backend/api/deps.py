"""Typed dependencies, so a route's signature says what it needs: a session, a row id (who may call a route:
backend/auth/deps.py)."""
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path
from sqlalchemy.orm import Session

from backend.core.db import get_sessionmaker


def get_session() -> Iterator[Session]:
    """The request's session; whatever the request wrote and did not commit is rolled back if it fails."""
    session = get_sessionmaker()()
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]
# Row ids in the URL: bounded to the database's integer range, so a huge id is a 422, not a database error.
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]
