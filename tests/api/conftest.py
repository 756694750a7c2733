"""The in-process API layer: the FastAPI app under Starlette's TestClient, on a fresh SQLite database.

For contract and authorization checks that need no worker, broker or browser (a 403 does not need Celery). The
flows that do (approve -> queue -> train -> metrics) stay in tests/integration, against the real services.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from backend.auth.roles import Role

ROLES = [r.value for r in Role]
WORKER_QUEUE = "gpu-h100-80gb"  # tiny_plan's GPU's: the worker token of `tokens` serves it


def _clear_caches() -> None:
    from backend.core import db, settings

    settings.get_settings.cache_clear()
    db.get_engine.cache_clear()
    db.get_sessionmaker.cache_clear()


@pytest.fixture(scope="package")
def app_env(tmp_path_factory) -> Iterator[dict]:
    """ULAB_ settings for the in-process app (set for the tests/api package only, then restored, so the real-service
    tests that follow see their own environment): SQLite under a temp home, an in-memory broker (nothing consumes it),
    run paths allowed under the temp directory, and an empty calibration folder (the default, bench/results, holds
    the project's measured GPU rows: POST /api/calibration/load in one test file put them in every later one's
    counts)."""
    home = tmp_path_factory.mktemp("api-home")
    (home / "results").mkdir()
    env = {"ULAB_HOME": str(home), "ULAB_DATABASE_URL": f"sqlite:///{home / 'ulab.db'}",
           "ULAB_BROKER_URL": "memory://", "ULAB_ALLOWED_ROOTS": str(home.parent),
           "ULAB_CALIBRATION_DIR": str(home / "results")}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    _clear_caches()
    from backend.core.db import upgrade_database

    upgrade_database()
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _clear_caches()


@pytest.fixture(scope="package")
def app(app_env):
    from backend.main import create_app

    return create_app()


@pytest.fixture(scope="package")
def tokens(app_env) -> dict[str, str]:
    """One token per role, created in the database."""
    from backend.auth.service import create_token
    from backend.core.db import get_sessionmaker

    with get_sessionmaker()() as session:
        return {role: create_token(session, f"api-test {role}", Role(role),
                                   [WORKER_QUEUE] if role == Role.WORKER else None)[1] for role in ROLES}


@pytest.fixture(scope="package")
def client(app) -> Iterator[TestClient]:
    """A client without a token (no lifespan: the reaper is not needed here)."""
    yield TestClient(app, raise_server_exceptions=True)


def as_role(client: TestClient, tokens: dict[str, str], role: str | None) -> dict:
    return {"Authorization": f"Bearer {tokens[role]}"} if role else {}
