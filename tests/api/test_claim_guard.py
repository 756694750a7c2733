"""The allowed-roots check runs again when a worker claims a run (over the agent API): a data directory that did not
exist at submit, made a symlink out of the roots later, is refused at run time with the field in the reason."""
from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from backend.auth.models import ApiToken
from backend.auth.service import hash_token
from backend.core.db import session_scope
from backend.core.settings import Settings
from backend.execution.agent import HttpRunAgent
from backend.runs.models import Run
from tests.api.conftest import as_role
from tests.tiny import tiny_plan

OUTSIDE = Path(__file__).resolve().parents[2] / "examples"  # the repository: not under the test's allowed roots


def worker(client, tokens) -> HttpRunAgent:
    """The worker's client of the agent API, holding the worker token of the run's queue."""
    return HttpRunAgent(Settings(worker_token=tokens["worker"]), client=client)


def submit_approved(client, tokens, data_path: Path, before_approval=lambda: None) -> int:
    admin = as_role(client, tokens, "admin")
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data_path)}}}, headers=admin)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    before_approval()
    r = client.post(f"/api/runs/{run_id}/approve", headers=admin)
    assert r.json().get("state") == "queued", r.text
    return run_id


def test_a_path_made_a_symlink_out_of_the_roots_after_submit_is_refused_at_claim(client, tokens, tmp_path):
    later = tmp_path / "later"  # does not exist at submit: nothing to resolve yet

    def make_data():  # approval checks that the data exists (and is still inside the roots)
        later.mkdir()
        (later / "data.txt").write_text("x\n")

    run_id = submit_approved(client, tokens, later / "data.txt", make_data)
    (later / "data.txt").unlink()
    later.rmdir()
    later.symlink_to(OUTSIDE, target_is_directory=True)  # between approval and the worker's claim
    assert worker(client, tokens).claim(run_id, "test-worker:1") is None
    run = client.get(f"/api/runs/{run_id}", headers=as_role(client, tokens, "viewer")).json()
    assert run["state"] == "failed"
    assert run["exit_reason"].startswith("refused when claimed: run.data.path: ")
    assert "outside the allowed roots" in run["exit_reason"]


def test_a_path_still_inside_the_roots_is_claimed(client, tokens, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("x\n")
    run_id = submit_approved(client, tokens, data)
    claim = worker(client, tokens).claim(run_id, "test-worker:1")
    assert claim is not None
    assert claim.worker == "test-worker:1"
    with session_scope() as s:
        run = s.get_one(Run, run_id)
        worker_id = s.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(tokens["worker"])))
        assert (run.state, run.claimed_token_id) == ("starting", worker_id)
    assert worker(client, tokens).claim(run_id, "test-worker:2") is None  # a second delivery gets nothing
