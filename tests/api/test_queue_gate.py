"""One gate for every path to `queued` (approve, force, retry, resume from here), only the tokens of a run's
live attempt write it, completeness counts the live attempt's points, and tags/notes follow cancel's ownership."""
from __future__ import annotations

import copy

from backend.auth.roles import Role
from backend.core.db import session_scope
from backend.core.settings import Settings
from backend.execution.agent import HttpRunAgent
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import RunState
from tests.api.conftest import as_role
from tests.api.test_token_scope import new_token, queued_run
from tests.tiny import tiny_plan


def submitted_run(client, headers, tmp_path, run: dict | None = None):
    """A run of the tiny plan, pending approval; with `run` fields added, None when the submit refused them (a 422
    naming one of them)."""
    data = tmp_path / "d.txt"
    data.write_text("x\n")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=headers).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}, **(run or {})}},
                    headers=headers)
    if run and r.status_code == 422 and r.json()["detail"][0]["field"] in {f"run.{k}" for k in run}:
        return None
    assert r.status_code == 201, r.text
    return r.json()["id"]


def points(*steps: int, first_step: int | None = None) -> dict:
    body: dict = {"points": [{"rank": 0, "step": s, "name": "loss", "value": 2.0} for s in steps]}
    if first_step is not None:
        body["first_step"] = first_step
    return body


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def claimed(client, worker_token: str, run_id: int) -> str:
    """Claim the run over the agent API with `worker_token`; answers the attempt's token (it writes the metrics)."""
    claim = HttpRunAgent(Settings(worker_token=worker_token), client=client).claim(run_id, "w:1")
    assert claim is not None
    return claim.token


def test_a_never_approved_run_cancelled_then_retried_is_refused(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = submitted_run(client, admin, tmp_path)
    assert client.post(f"/api/runs/{run_id}/cancel", headers=admin).json()["state"] == "cancelled"
    r = client.post(f"/api/runs/{run_id}/retry", headers=admin)
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "state", r.text
    assert "never approved" in r.json()["detail"][0]["message"]
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert (run["state"], run["attempt"], run["approved_by"]) == ("cancelled", 1, None)


def test_a_retry_passes_the_fit_check_and_records_who_queued_each_attempt(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    approver, approver_id = new_token(Role.APPROVER)
    run_id = submitted_run(client, admin, tmp_path)
    r = client.post(f"/api/runs/{run_id}/approve", headers=bearer(approver))
    assert r.json()["queued_by"] == approver_id, r.text
    run = transitions.claim(run_id, "w:1", token_id=None)
    assert run is not None
    assert transitions.start(run_id, 1, str(tmp_path))
    assert transitions.finish(run_id, 1, RunState.FAILED, "boom")
    # the estimate now says it does not fit (as if the plan had grown): the retry is refused, as approval would be
    with session_scope() as s:
        stored = s.get_one(Run, run_id)
        fits = copy.deepcopy(stored.estimate)
        stored.estimate = {**fits, "memory": {**fits["memory"], "fits": False, "device_total_gib": 54895.0}}
    r = client.post(f"/api/runs/{run_id}/retry", headers=admin)
    assert r.status_code == 409, r.text
    assert r.json()["detail"][0]["field"] == "estimate.memory", r.text
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["state"] == "failed"
    with session_scope() as s:
        stored = s.get_one(Run, run_id)
        stored.estimate = fits
    retrier, retrier_id = new_token(Role.APPROVER)
    r = client.post(f"/api/runs/{run_id}/retry", headers=bearer(retrier))
    assert r.status_code == 200, r.text
    assert r.json()["attempt"] == 2, r.text
    assert r.json()["queued_by"] == retrier_id
    attempts = client.get(f"/api/runs/{run_id}", headers=admin).json()["attempts"]
    assert [(a["attempt"], a["queued_by"]) for a in attempts] == [(1, approver_id)]


def test_no_token_writes_a_run_no_worker_holds(client, tokens, tmp_path):
    worker, _ = new_token(Role.WORKER)
    admin = as_role(client, tokens, "admin")
    cancelled = submitted_run(client, admin, tmp_path)  # cancelled before it started: nobody claimed it
    assert client.post(f"/api/runs/{cancelled}/cancel", headers=admin).status_code == 200
    r = client.post(f"/api/runs/{cancelled}/metrics", json=points(1), headers=bearer(worker))
    assert r.status_code == 403, r.text
    assert r.json()["detail"][0]["field"] == "authorization", r.text

    run_id = queued_run(client, tokens, tmp_path)  # a queued retry: its claim was cleared
    first = claimed(client, worker, run_id)
    assert transitions.start(run_id, 1, str(tmp_path))
    assert transitions.finish(run_id, 1, RunState.LOST, "x")
    assert client.post(f"/api/runs/{run_id}/retry", headers=admin).json()["state"] == "queued"
    for token in (worker, first):
        r = client.post(f"/api/runs/{run_id}/metrics", json=points(1), headers=bearer(token))
        assert r.status_code in (401, 403), r.text
        assert r.json()["detail"][0]["field"] == "authorization", r.text


def test_completeness_counts_the_live_attempts_points(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = queued_run(client, tokens, tmp_path)
    steps = client.get(f"/api/runs/{run_id}", headers=admin).json()["steps"]
    first = claimed(client, tokens["worker"], run_id)
    assert transitions.start(run_id, 1, str(tmp_path))
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(*range(1, steps + 1), first_step=1),
                    headers=bearer(first))
    assert r.status_code == 200, r.text
    assert transitions.finish(run_id, 1, RunState.LOST, "torchrun killed")
    assert client.post(f"/api/runs/{run_id}/retry", headers=admin).status_code == 200
    # attempt 2 starts from scratch and stores every step but the last: attempt 1's last step must not count
    second = claimed(client, tokens["worker"], run_id)
    assert transitions.start(run_id, 2, str(tmp_path))
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(*range(1, steps), first_step=1),
                    headers=bearer(second))
    assert r.status_code == 200, r.text
    assert transitions.finish(run_id, 2, RunState.SUCCEEDED, None)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "failed", run
    assert run["exit_reason"].startswith(f"the trainer finished, but 1 of the {steps} steps have no metrics stored")


def test_a_resumed_attempt_counts_the_steps_before_its_checkpoint(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = queued_run(client, tokens, tmp_path)
    steps = client.get(f"/api/runs/{run_id}", headers=admin).json()["steps"]
    assert steps >= 3
    first = claimed(client, tokens["worker"], run_id)
    assert transitions.start(run_id, 1, str(tmp_path))
    client.post(f"/api/runs/{run_id}/metrics", json=points(1, 2, first_step=1), headers=bearer(first))
    assert transitions.finish(run_id, 1, RunState.LOST, "x")
    assert client.post(f"/api/runs/{run_id}/retry", headers=admin).status_code == 200
    first = claimed(client, tokens["worker"], run_id)
    assert transitions.start(run_id, 2, str(tmp_path))
    # resumed from the checkpoint at step 2: its file starts at step 3
    r = client.post(f"/api/runs/{run_id}/metrics", json=points(*range(3, steps + 1), first_step=3),
                    headers=bearer(first))
    assert r.status_code == 200, r.text
    assert transitions.finish(run_id, 2, RunState.SUCCEEDED, None)
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["state"] == "succeeded"


def test_tags_and_notes_of_another_submitters_run_are_refused(client, tokens, tmp_path):
    owner, _ = new_token(Role.SUBMITTER)
    other, _ = new_token(Role.SUBMITTER)
    run_id = submitted_run(client, bearer(owner), tmp_path)
    r = client.patch(f"/api/runs/{run_id}", json={"notes": "mine now"}, headers=bearer(other))
    assert r.status_code == 403, r.text
    assert r.json()["detail"][0]["field"] == "authorization", r.text
    assert client.patch(f"/api/runs/{run_id}", json={"notes": "owner"}, headers=bearer(owner)).status_code == 200
    approver = as_role(client, tokens, "approver")
    r = client.patch(f"/api/runs/{run_id}", json={"tags": ["checked"]}, headers=approver)
    assert r.status_code == 200, r.text
    assert r.json()["notes"] == "owner", r.text
