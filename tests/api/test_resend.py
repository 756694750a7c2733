"""Re-send of queued runs by the API's supervision loop: a run unclaimed for ULAB_RESEND_AFTER_S
is sent again, then after a doubling wait. The real broker flush: tests/integration/test_faults.py."""
from __future__ import annotations

from datetime import timedelta

from backend.core.db import session_scope
from backend.execution.reaper import resend_queued
from backend.runs.models import Run
from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def backdate(run_id: int, seconds: float) -> None:
    """Move the run's queue and send times `seconds` into the past, as if that long had passed."""
    with session_scope() as s:
        run = s.get_one(Run, run_id)
        run.queued_at -= timedelta(seconds=seconds)
        run.sent_at -= timedelta(seconds=seconds)


def test_a_queued_run_is_resent_after_the_wait_and_the_wait_doubles(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    data = tmp_path / "d.txt"
    data.write_text("x\n")
    run_id = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                         headers=admin).json()["id"]
    assert client.post(f"/api/runs/{run_id}/approve", headers=admin).json()["state"] == "queued"
    assert run_id not in resend_queued(30)  # just sent on approval
    backdate(run_id, 31)
    assert run_id in resend_queued(30)  # unclaimed for 31 s: sent again
    assert run_id not in resend_queued(30)
    backdate(run_id, 33)  # queued 64 s ago, sent 33 s ago after waiting 31 s: due
    assert run_id in resend_queued(30)
    backdate(run_id, 40)  # queued 104 s ago, sent 40 s ago after waiting 64 s: it waits 64 s now
    assert run_id not in resend_queued(30)
    backdate(run_id, 25)
    assert run_id in resend_queued(30)
    client.post(f"/api/runs/{run_id}/cancel", headers=admin)
    backdate(run_id, 1000)
    assert run_id not in resend_queued(30)  # only queued runs
