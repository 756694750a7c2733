""""Resume from here": a retry from a chosen checkpoint (POST /api/runs/{id}/retry {"from_checkpoint": ...}) queues
the next attempt with it, and the worker's command carries it to the trainer, whose launcher moves the newer
checkpoints aside (worker/trainer/checkpoints.discard_newer). The trainer side runs for real in
tests/integration/test_trainer_resume.py and, from the run page, in tests/e2e/test_dashboard_divergence.py."""
from __future__ import annotations

import json

import pytest

from backend.executors.slurm.jobscript import JobRequest, render
from tests.api.conftest import as_role
from tests.api.test_alerts import running_run
from worker.supervise import trainer_command
from worker.trainer.checkpoints import discard_newer, latest_checkpoint


def checkpoint(run_dir, stage: int, step: int, complete: bool = True) -> None:
    ck = run_dir / "checkpoints" / f"stage{stage}" / f"checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"x" * 100)
    if complete:
        (ck / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def test_a_retry_from_a_listed_checkpoint_queues_it_and_a_wrong_one_is_refused(client, tokens, tmp_path):
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    for step, complete in ((10, True), (20, True), (30, False)):
        checkpoint(tmp_path, 0, step, complete)
    assert transitions.finish(run_id, 1, RunState.FAILED, "boom", last_step=31)
    listed = client.get(f"/api/runs/{run_id}/checkpoints", headers=admin).json()
    assert {(c["step"], c["complete"]) for c in listed} == {(10, True), (20, True), (30, False)}
    for bad, says in (("stage0/../../etc", "is not stage<i>/checkpoint-<step>"),
                      ("stage0/checkpoint-30", "has no complete checkpoint stage0/checkpoint-30"),
                      ("stage1/checkpoint-10", "on disk: stage0/checkpoint-10, stage0/checkpoint-20")):
        r = client.post(f"/api/runs/{run_id}/retry", json={"from_checkpoint": bad}, headers=admin)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["field"] == "from_checkpoint", r.text
        assert says in r.json()["detail"][0]["message"], r.text
    r = client.post(f"/api/runs/{run_id}/retry", json={"from_checkpoint": "stage0/checkpoint-10"}, headers=admin)
    assert r.status_code == 200, r.text
    run = r.json()
    assert (run["state"], run["attempt"], run["resume_from"]) == ("queued", 2, "stage0/checkpoint-10")
    # the worker's command and the Slurm job script carry it to the trainer
    cmd = trainer_command(tmp_path / "plan.json", tmp_path, run["attempt"], run["resume_from"])
    assert cmd[-3:] == ["--resume", "--resume-from", "stage0/checkpoint-10"]
    script = render(JobRequest(run_id=run_id, attempt=2, nodes=1, gpus_per_node=0, grace_s=60,
                               plan=tmp_path / "plan.json", ulab="ulab", resume_from=run["resume_from"]))
    assert "\nexport ULAB_RESUME_FROM=stage0/checkpoint-10\n" in script
    with pytest.raises(ValueError, match="resume_from"):
        render(JobRequest(run_id=run_id, attempt=2, nodes=1, gpus_per_node=0, grace_s=60, plan=tmp_path / "p",
                          ulab="ulab", resume_from="stage0/checkpoint-1; rm -rf /"))


def test_a_plain_retry_after_one_from_a_checkpoint_resumes_from_the_newest(client, tokens, tmp_path):
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    checkpoint(tmp_path, 0, 10)
    assert transitions.finish(run_id, 1, RunState.FAILED, "boom", last_step=12)
    assert client.post(f"/api/runs/{run_id}/retry", json={"from_checkpoint": "stage0/checkpoint-10"},
                       headers=admin).json()["resume_from"] == "stage0/checkpoint-10"
    assert client.post(f"/api/runs/{run_id}/cancel", headers=admin).json()["state"] == "cancelled"
    again = client.post(f"/api/runs/{run_id}/retry", headers=admin).json()
    assert (again["attempt"], again["resume_from"]) == (3, None)
    assert trainer_command(tmp_path / "plan.json", tmp_path, 3, again["resume_from"])[-1] == "--resume"


def test_the_launcher_moves_the_newer_checkpoints_aside(tmp_path):
    for stage, step in ((0, 10), (0, 20), (1, 5)):
        checkpoint(tmp_path, stage, step)
    moved = discard_newer(tmp_path, "stage0/checkpoint-10", attempt=3)
    assert [p.relative_to(tmp_path).as_posix() for p in moved] == [
        "checkpoints-discarded/attempt-3/stage0/checkpoint-20", "checkpoints-discarded/attempt-3/stage1/checkpoint-5"]
    assert latest_checkpoint(tmp_path)[1] == tmp_path / "checkpoints/stage0/checkpoint-10"
    for bad in ("stage0/checkpoint-20", "../x", "stage0/checkpoint-10/../../y"):
        with pytest.raises(ValueError, match="--resume-from"):
            discard_newer(tmp_path, bad, attempt=4)


def test_a_diverged_runs_checkpoints_offer_the_one_before_first_and_a_resume_inherits_the_reference(
        client, tokens, tmp_path):
    """The trainer's records (plan/guardrails.GUARD_FILE) as the lr=10 run leaves them: checkpoint-1 within bounds,
    checkpoint-3 the stop's. The list offers checkpoint-1 first and calls checkpoint-3 diverged; a resume from
    checkpoint-3 at lr=1e-3 inherits the run's lowest loss (6.2), so a loss that stays near 4,500 fires on the
    attempt's third step, while its own steps alone (4,568 -> 4,501) never would. Each attempt keeps its plan."""
    from backend.runs import transitions
    from backend.runs.states import RunState
    from plan.guardrails import GUARD_FILE, Divergence, guard_record
    from tests.api.test_alerts import alerts_of, ingest, loss_points

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, learning_rate=10.0, divergence_factor=3.0)
    losses = {1: 6.2, 2: 1152.4, 3: 3924.3}
    rule = Divergence(3.0)
    for step, loss in losses.items():
        rule.observe(step, loss)
        if step in (1, 3):
            checkpoint(tmp_path, 0, step)
            (tmp_path / "checkpoints" / "stage0" / f"checkpoint-{step}" / GUARD_FILE).write_text(
                guard_record(step, loss, rule))
    ingest(client, admin, run_id, loss_points(losses))
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    assert transitions.finish(run_id, 1, RunState.CANCELLED, "cancelled by request", last_step=3)
    listed = client.get(f"/api/runs/{run_id}/checkpoints", headers=admin).json()
    assert [(c["step"], c["diverged"], c["loss"]) for c in listed] == [(1, False, 6.2), (3, True, 3924.3)]

    r = client.post(f"/api/runs/{run_id}/retry", json={"from_checkpoint": "stage0/checkpoint-3",
                                                       "learning_rate": 1e-3}, headers=admin)
    assert r.status_code == 200, r.text
    assert transitions.claim(run_id, "test-worker") is not None
    assert transitions.start(run_id, 2, str(tmp_path))
    ingest(client, admin, run_id, loss_points({4: 4568.0, 5: 4540.0}))
    assert [a["attempt"] for a in client.get(f"/api/runs/{run_id}", headers=admin).json()["alerts"]] == [1]
    ingest(client, admin, run_id, loss_points({6: 4501.0}))
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    second = [a for a in run["alerts"] if a["attempt"] == 2]
    assert [(a["kind"], a["step"], a["stopped"]) for a in second] == [("loss_diverged", 6, True)], run["alerts"]
    assert second[0]["message"] == ("loss diverged: 4501 at step 6 is above 3 x the run's lowest loss up to the "
                                    "checkpoint this attempt resumed from 6.2"), second
    assert transitions.finish(run_id, 2, RunState.CANCELLED, "cancelled by request", last_step=6)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "stopped"
    assert [a["spec"]["run"]["learning_rate"] for a in run["attempts"]] == [10.0, 1e-3]
