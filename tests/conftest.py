"""Shared fixtures: real PostgreSQL, Redis, API and Celery worker processes, and one trained tiny run."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# Nothing the trainer runs is compiled, but DeepSpeed's ZeRO optimizer check imports its Muon module, whose functions
# are decorated with torch.compile at import: that loads TorchInductor, 0.7 s of CPU in every rank of every run the
# suite starts. Dynamo off makes torch.compile a no-op for this process and every process it starts (API, worker,
# trainers, Slurm jobs); the product's own environment is left as it is.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# DeepSpeed's CPU ops of this checkout, as `make test` builds them (Makefile: TORCH_EXTENSIONS_DIR)
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(__file__).resolve().parents[1] / "var" / "torch_extensions"))

# OpenMP's idle threads sleep in this process too (worker/__init__.py sets it for the worker's processes; its
# import sets it here before anything imports torch): the suite's two test processes share the machine's cores.
import worker  # noqa: F401
from tests.e2e import browser
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import submit, tiny_plan, wait_for, write_corpus

TRAINED_STEPS = 12


@pytest.fixture(scope="session", autouse=True)
def _browser_closed_at_the_end():
    """Pages share one Chromium per test process (tests/e2e/browser.py); it closes with the session."""
    yield
    browser.stop_browser()


def _clear_database_caches() -> None:
    from backend.core import db, settings

    for cached in (settings.get_settings, db.get_engine, db.get_sessionmaker):
        cached.cache_clear()


@pytest.fixture(scope="session")
def _sqlite_at_head(tmp_path_factory) -> Path:
    """One SQLite file migrated to head for the session (alembic takes ~1-3 s here); sqlite_db copies it."""
    from backend.core import db

    path = tmp_path_factory.mktemp("sqlite-head") / "ulab.db"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ULAB_DATABASE_URL", f"sqlite:///{path}")
        _clear_database_caches()
        db.upgrade_database()
        db.get_engine().dispose()  # the last connection closes: WAL checkpointed into the file
        _clear_database_caches()
    assert not path.with_name(path.name + "-wal").exists(), "the migrated SQLite file still has a WAL beside it"
    return path


@pytest.fixture
def sqlite_db(_sqlite_at_head, tmp_path, monkeypatch) -> Iterator[str]:
    """A fresh SQLite database at head (the embedded default), named by ULAB_DATABASE_URL for this test: a copy of
    the session's migrated file. The cached settings, engine and sessionmaker are cleared before and after, so no
    other test sees it. Answers its URL. Settings a test needs with it: set them in a fixture that runs first
    (an autouse one)."""
    path = tmp_path / "ulab.db"
    shutil.copyfile(_sqlite_at_head, path)
    url = f"sqlite:///{path}"
    monkeypatch.setenv("ULAB_DATABASE_URL", url)
    _clear_database_caches()
    yield url
    _clear_database_caches()


@pytest.fixture(scope="session")
def pg_url():
    with postgres_database() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url():
    with redis_database() as url:
        yield url


@pytest.fixture(scope="session")
def stack(tmp_path_factory, pg_url, redis_url):
    """The API and a real Celery worker on PostgreSQL and Redis; the worker trains on CPU ranks.
    Browser pages opened with tests.e2e.browser.chromium_page() are signed in with its admin token."""
    home = tmp_path_factory.mktemp("stack")
    s = Stack(home, pg_url, redis_url, ULAB_CALIBRATION_DIR=str(home / "results")).start()
    browser.sign_in_by_default(s.url, s.admin_token)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def api_server(stack) -> str:
    """Base URL of the running API (the same server the worker reports to)."""
    return stack.url


@pytest.fixture(scope="session")
def api(stack):
    """An HTTP client for the stack, signed in as admin."""
    with stack.client() as client:
        yield client


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("data") / "tiny.txt")


@pytest.fixture(scope="session")
def trained_run(api, corpus) -> dict:
    """One real Ulysses SP run (sp=2, 2 CPU ranks, seq_len 512) trained to the end; shared across tests. It holds one
    row back and scores it by position every 6 steps, and ends with a passkey test of its model (evaluate.py); a
    smoke-test gate (run.probe) checks its first 3 steps."""
    run = submit(api, tiny_plan(sp_size=2), {
        "learning_rate": 1e-3, "seed": 0, "data": {"path": str(corpus)}, "eval_rows": 1, "eval_every": 6,
        "report_to": ["tensorboard"],  # the worker mirrors it to TensorBoard (tests/integration/test_monitoring.py)
        # a smoke-test gate it passes (test_probe_gate_runs.py): CPU ranks reach a tiny share of an H100's tokens/s
        "probe": {"steps": 3, "max_memory_fraction": 0.9, "min_tokens_per_s_fraction": 1e-7},
        "stages": [{"seq_len": 512, "steps": TRAINED_STEPS},
                   {"kind": "passkey", "seq_len": 512, "lengths": [128, 256, 512], "depths": [0.0, 0.5, 1.0]}],
    }, name="tiny-sp2")
    return wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
