"""A worker that dies without its shutdown report (SIGKILL) stops being `up` on GET /api/workers: a real API and a
real Celery worker on their own PostgreSQL and Redis databases; the worker's heartbeat thread keeps it `up` while
it lives, and it turns `lost` once its last heartbeat is older than ULAB_WORKER_LOST_AFTER_S."""
from __future__ import annotations

import signal
import time

import pytest

from tests.services import Stack, postgres_database, redis_database

pytestmark = pytest.mark.slow
LOST_AFTER_S = 6.0


def _mine(api, name: str | None = None) -> dict | None:
    rows = [w for w in api.get("/api/workers").json() if "gpu-h100-80gb" in w["queues"]]
    return next((w for w in rows if name is None or w["name"] == name), None)


def _wait(api, name: str | None, predicate, timeout_s: float, what: str) -> dict:
    end = time.monotonic() + timeout_s
    row = None
    while time.monotonic() < end:
        row = _mine(api, name)
        if row is not None and predicate(row):
            return row
        time.sleep(0.5)
    raise AssertionError(f"{what}: last seen {row}")


def test_a_worker_killed_with_sigkill_shows_lost(tmp_path):
    with postgres_database() as pg, redis_database() as broker:
        stack = Stack(tmp_path / "stack", pg, broker, ULAB_WORKER_HEARTBEAT_S="0.5",
                      ULAB_WORKER_LOST_AFTER_S=str(LOST_AFTER_S)).start()
        try:
            api = stack.client("viewer")
            first = _wait(api, None, lambda w: w["state"] == "up", 60, "the worker never showed up")
            name = first["name"]
            # the heartbeat moves while the worker lives, and it stays up past the threshold
            later = _wait(api, name, lambda w: w["heartbeat_at"] > first["heartbeat_at"], 60,
                          "the worker's heartbeat never moved")
            time.sleep(LOST_AFTER_S + 1)
            assert _mine(api, name)["state"] == "up", _mine(api, name)
            assert later["stopped_at"] is None

            stack.worker.stop(sig=signal.SIGKILL)  # no worker_shutdown report: only the silence tells
            assert stack.worker.proc.returncode == -signal.SIGKILL
            lost = _wait(api, name, lambda w: w["state"] != "up", 120, "the killed worker stayed up")
            assert lost["state"] == "lost", lost
            assert lost["stopped_at"] is None, lost
            # listed after the live ones, and a second read agrees (the state does not flap back)
            assert _mine(api, name)["state"] == "lost"
        finally:
            stack.stop()
