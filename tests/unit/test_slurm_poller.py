"""The Slurm poller's table (backend/executors/slurm/poller.py) on SQLite: what a job's Slurm state does to its run.
Slurm's answers are given as data (Job rows, what `scontrol show job` parses to); the states the one-node test
cluster cannot produce (OUT_OF_MEMORY, TIMEOUT, NODE_FAIL) are covered here, the rest also against a real Slurm in
tests/integration/test_slurm.py. scancel, where the poller calls it, finds no cluster and only logs."""
from __future__ import annotations

import pytest

from backend.core import db, settings
from backend.executors.slurm.poller import Poller, tracked_runs
from backend.executors.slurm.submit import Job
from backend.runs import transitions
from backend.runs.models import Run


@pytest.fixture(autouse=True)
def no_cluster(tmp_path, monkeypatch):
    """Set before sqlite_db reads the settings (autouse fixtures run first)."""
    monkeypatch.setenv("ULAB_SLURM_SHARED_DIR", str(tmp_path / "cluster-fs"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # scancel: not found, logged


pytestmark = pytest.mark.usefixtures("sqlite_db")


def queued_slurm_run(job_id: str = "41", max_retries: int = 0) -> int:
    with db.session_scope() as s:
        run = Run(name="r", spec={"run": {}}, executor="slurm", max_retries=max_retries)
        s.add(run)
        s.flush()
        transitions.approve(run, by=None, forced=False)
        run_id = run.id
    assert transitions.slurm_submitted(run_id, 1, job_id)
    return run_id


def load(run_id: int) -> Run:
    with db.session_scope() as s:
        return s.get(Run, run_id)


def follow(run_id: int, state: str, exit_code: int = 0, restarts: int = 0, reason: str = "None") -> Run:
    poller = Poller(settings.get_settings())
    [tracked] = [t for t in tracked_runs() if t.id == run_id]
    poller.follow(tracked, Job(tracked.job_id or "", state, reason, "gpu[01-02]", exit_code, restarts))
    return load(run_id)


def test_pending_shows_the_reason_then_running_then_completed():
    run_id = queued_slurm_run()
    run = follow(run_id, "PENDING", reason="Priority")
    assert (run.state, run.slurm_state, run.slurm_reason) == ("queued", "PENDING", "Priority")
    run = follow(run_id, "RUNNING")
    assert (run.state, run.slurm_nodes, run.worker) == ("running", "gpu[01-02]", "slurm job 41 on gpu[01-02]")
    run = follow(run_id, "COMPLETED")
    assert (run.state, run.exit_reason, run.slurm_state) == ("succeeded", None, "COMPLETED")
    assert tracked_runs() == []  # nothing left to follow


@pytest.mark.parametrize("slurm_state,exit_code,ours", [
    ("FAILED", 1, "failed"), ("FAILED", 3, "oom"), ("OUT_OF_MEMORY", 0, "oom"), ("CANCELLED", 0, "cancelled"),
    ("FAILED", 76, "stopped")])  # 76: the trainer stopped itself on a stop rule (worker/trainer/stop_rules.py)
def test_ended_jobs_end_their_runs(slurm_state, exit_code, ours):
    run_id = queued_slurm_run()
    follow(run_id, "RUNNING")
    run = follow(run_id, slurm_state, exit_code=exit_code)
    assert run.state == ours
    assert run.attempts[-1].state == ours
    if ours != "succeeded":
        assert run.exit_reason.startswith(f"Slurm job 41 {slurm_state}, exit code {exit_code}")


def test_a_job_that_ends_before_a_poll_saw_it_run_still_records_its_attempt():
    run_id = queued_slurm_run()
    run = follow(run_id, "COMPLETED")
    assert run.state == "succeeded"
    assert [a.state for a in run.attempts] == ["succeeded"]


@pytest.mark.parametrize("slurm_state", ["TIMEOUT", "NODE_FAIL", "PREEMPTED"])
def test_lost_jobs_queue_a_new_job_when_retries_remain(slurm_state):
    run_id = queued_slurm_run(max_retries=1)
    follow(run_id, "RUNNING")
    run = follow(run_id, slurm_state)
    assert (run.state, run.attempt, run.slurm_job_id) == ("queued", 2, None)  # the next poll submits a new job
    assert [a.state for a in run.attempts] == ["lost"]
    assert run.attempts[0].exit_reason == f"Slurm job 41 ended {slurm_state}"


def test_lost_without_retries_stays_lost():
    run_id = queued_slurm_run(max_retries=0)
    follow(run_id, "RUNNING")
    run = follow(run_id, "TIMEOUT")
    assert run.state == "lost"
    assert run.attempt == 1


def test_a_job_slurm_requeued_serves_the_next_attempt():
    run_id = queued_slurm_run(max_retries=1)
    follow(run_id, "RUNNING")
    run = follow(run_id, "PENDING", restarts=1, reason="BeginTime")
    assert (run.state, run.attempt, run.slurm_job_id, run.slurm_restarts) == ("queued", 2, "41", 1)
    assert run.slurm_reason == "BeginTime"
    run = follow(run_id, "RUNNING", restarts=1)
    assert run.state == "running"
    assert run.attempt == 2
    run = follow(run_id, "COMPLETED", restarts=1)
    assert [a.state for a in run.attempts] == ["lost", "succeeded"]


def test_a_requeue_seen_before_slurm_counted_it_is_one_requeue():
    """Slurm may show the job waiting again before its restart count has gone up: that is the same requeue."""
    run_id = queued_slurm_run(max_retries=2)
    follow(run_id, "RUNNING")
    run = follow(run_id, "REQUEUED", restarts=0)
    assert (run.state, run.attempt) == ("queued", 2)
    run = follow(run_id, "COMPLETING", restarts=1)  # the requeued attempt's processes are still being ended
    assert (run.state, run.attempt) == ("queued", 2)
    follow(run_id, "PENDING", restarts=1)
    run = follow(run_id, "RUNNING", restarts=1)
    assert (run.state, run.attempt) == ("running", 2)
    run = follow(run_id, "RUNNING", restarts=1)
    assert (run.state, run.attempt, run.slurm_restarts) == ("running", 2, 1)


def test_a_requeue_missed_between_two_polls_is_seen_by_the_restart_count():
    run_id = queued_slurm_run(max_retries=1)
    follow(run_id, "RUNNING")
    run = follow(run_id, "RUNNING", restarts=1)  # requeued and running again before the poller looked
    assert (run.state, run.attempt) == ("running", 2)
    assert [a.state for a in run.attempts] == ["lost"]


def test_cancel_requested_ends_cancelled_whatever_the_trainer_exit():
    run_id = queued_slurm_run()
    follow(run_id, "RUNNING")
    with db.session_scope() as s:
        transitions.request_cancel(s, s.get(Run, run_id))
    follow(run_id, "RUNNING")  # sends scancel --signal=TERM
    run = follow(run_id, "FAILED", exit_code=75)  # the trainer saved a checkpoint and exited 75
    assert (run.state, run.exit_reason) == ("cancelled", "cancelled by request")


def test_a_job_slurm_forgot_is_lost():
    run_id = queued_slurm_run()
    follow(run_id, "RUNNING")
    poller = Poller(settings.get_settings())
    [tracked] = tracked_runs()
    poller.follow(tracked, None)
    run = load(run_id)
    assert run.state == "lost"
    assert run.exit_reason == "Slurm no longer knows job 41"
