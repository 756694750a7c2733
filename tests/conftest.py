"""Shared fixtures: real PostgreSQL, Redis, API and Celery worker processes, and one trained tiny run."""
from __future__ import annotations

import os

import pytest

# Nothing the trainer runs is compiled, but DeepSpeed's ZeRO optimizer check imports its Muon module, whose functions
# are decorated with torch.compile at import: that loads TorchInductor, 0.7 s of CPU in every rank of every run the
# suite starts. Dynamo off makes torch.compile a no-op for this process and every process it starts (API, worker,
# trainers, Slurm jobs); the product's own environment is left as it is.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

from tests.e2e import browser
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import submit, tiny_plan, wait_for, write_corpus

TRAINED_STEPS = 12


@pytest.fixture(scope="session", autouse=True)
def _browser_closed_at_the_end():
    """Pages share one Chromium per test process (tests/e2e/browser.py); it closes with the session."""
    yield
    browser.stop_browser()


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
