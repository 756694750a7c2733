"""The allowed-roots check runs again when a worker claims a run (issue 16, item 6): a data directory that did not
exist at submit, made a symlink out of the roots later, is refused at run time with the field in the reason."""
from __future__ import annotations

from pathlib import Path

from backend.runs import transitions
from tests.api.conftest import as_role
from tests.tiny import tiny_plan

OUTSIDE = Path(__file__).resolve().parents[2] / "examples"  # the repository: not under the test's allowed roots


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
    assert transitions.claim(run_id, "test-worker:1") is None
    run = client.get(f"/api/runs/{run_id}", headers=as_role(client, tokens, "viewer")).json()
    assert run["state"] == "failed"
    assert run["exit_reason"].startswith("refused when claimed: run.data.path: ")
    assert "outside the allowed roots" in run["exit_reason"]


def test_a_path_still_inside_the_roots_is_claimed(client, tokens, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("x\n")
    run_id = submit_approved(client, tokens, data)
    run = transitions.claim(run_id, "test-worker:1", token_id=7)
    assert run is not None
    assert run.state == "starting"
    assert run.claimed_token_id == 7
    assert transitions.claim(run_id, "test-worker:2") is None  # a second delivery gets nothing
