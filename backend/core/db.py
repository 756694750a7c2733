"""Engine, sessions and schema migration. The schema is created by Alembic only (migrations/)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from backend.core.settings import get_settings
from backend.core.text import storable_json_error

REPO_ROOT = Path(__file__).resolve().parents[2]


class Base(DeclarativeBase):
    pass


@event.listens_for(Session, "before_flush")
def _only_storable_values(session: Session, _context, _instances) -> None:
    """Every row written through a session holds only text and JSON that can be read back (strict UTF-8, finite
    numbers): one bad value would otherwise make every list that shows its row fail. Raises UnstorableValue (a 422
    in the API) before anything is written."""
    new = set(session.new)
    for obj in (*new, *session.dirty):
        state = inspect(obj)
        for attr in state.mapper.column_attrs:
            if obj not in new and not state.attrs[attr.key].history.added:
                continue  # an update checks only what it changes (a heartbeat does not re-read the spec)
            value = state.dict.get(attr.key)
            if isinstance(value, str | dict | list):
                error = storable_json_error(value, f"{state.mapper.local_table.name}.{attr.key}")
                if error is not None:
                    raise error


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # API, worker and shipper write at once: WAL + wait
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


@lru_cache
def get_engine() -> Engine:
    return _make_engine(get_settings().resolved_database_url)


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A session for code outside a request (worker, reaper): commits on success, rolls back on error."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config():
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", get_settings().resolved_database_url.replace("%", "%%"))
    return cfg


def upgrade_database() -> None:
    from alembic import command

    get_engine()  # creates the SQLite directory if needed
    command.upgrade(alembic_config(), "head")
