"""Supervision of a run's processes against real ones: `ulab train`, torchrun and its CPU ranks (each rank in a
session of its own), and, for the worker's half, a real Celery worker on PostgreSQL and Redis. The runs are
long (1,500 steps; the tiny model trains about 7 steps/s) so that every fault strikes mid-run: each test waits
for a stored step and checks that the run is still running before it strikes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.trainer_support import make_plan, write_documents
from tests.services import REPO, Stack, own_stack
from tests.tiny import TERMINAL, environ, tiny_plan, wait_for
from worker.supervise import last_words_dir
from worker.trainer.attempt import ATTEMPT_ENV, RUN_LOCK_ENV, lock_file, metrics_files, read_metrics

pytestmark = pytest.mark.slow
LONG = 1500  # runs that are struck early and never finish
REPRO_STEPS = 120  # the reproduction trains to the end: long enough to be struck mid-run, short enough for CI
REPRO_KILL_AT, REPRO_CHECKPOINT_EVERY = 40, 25
LOST_AFTER_S = 8


def run_processes(run_dir: Path) -> dict[int, str]:
    """pid -> attempt of every running process tagged with this run directory's lock (launcher, torchrun, ranks)."""
    lock, found = str(lock_file(run_dir)), {}
    for p in psutil.process_iter():
        try:
            env = p.environ()
            if env.get(RUN_LOCK_ENV) == lock and p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = env.get(ATTEMPT_ENV, "?")
        except psutil.Error:
            continue
    return found


def rank_pids(run_dir: Path) -> list[int]:
    """The ranks of the run: processes whose command line is the trainer and that torchrun started (LOCAL_RANK)."""
    pids = []
    for pid in run_processes(run_dir):
        try:
            if "LOCAL_RANK" in psutil.Process(pid).environ():
                pids.append(pid)
        except psutil.Error:
            continue
    return pids


def gone(pids: list[int]) -> bool:
    alive = []
    for pid in pids:
        try:
            alive.append(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
        except psutil.NoSuchProcess:
            pass
    return not any(alive)


def seconds_until_gone(pids: list[int], timeout_s: float) -> float | None:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if gone(pids):
            return time.monotonic() - start
        time.sleep(0.1)
    return None


def last_written_step(run_dir: Path) -> int:
    records = read_metrics(run_dir)
    return records[-1]["step"] if records else 0


class AttemptWatch(threading.Thread):
    """Samples the run's processes every 0.1 s and keeps the largest number of attempts alive at once."""

    def __init__(self, run_dir: Path):
        super().__init__(daemon=True)
        self.run_dir, self.most, self.seen = run_dir, 0, set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            attempts = set(run_processes(self.run_dir).values())
            self.seen |= attempts
            self.most = max(self.most, len(attempts))
            time.sleep(0.1)

    def stop(self) -> None:
        self.done.set()
        if self.is_alive():
            self.join(5)


# --- `ulab train` alone --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    return write_documents(tmp_path_factory.mktemp("supervision-data") / "docs.txt")


def start_train(plan: Path, run_dir: Path, log: Path, *args: str) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "worker.trainer", "--plan", str(plan), "--run-dir",
                                 str(run_dir), *args], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=REPO)


def wait_written(run_dir: Path, proc: subprocess.Popen, step: int, log: Path, timeout_s: float = 240) -> None:
    end = time.monotonic() + timeout_s
    while last_written_step(run_dir) < step:
        assert proc.poll() is None, f"the trainer ended early: {log.read_text()[-3000:]}"
        assert time.monotonic() < end, f"step {step} not written in {timeout_s} s"
        time.sleep(0.2)


def test_a_new_attempt_stops_the_one_still_in_the_run_dir_and_keeps_its_lines(tmp_path, documents):
    """Attempt 1 trains on (an orphan nobody stopped); attempt 2 starts in the same directory: it stops every
    process of attempt 1 before it trains, resumes from the checkpoint attempt 1 saved on SIGTERM, and writes
    a file of its own, so attempt 1's lines stay and together they cover every step once."""
    steps = 60  # attempt 2 stops it at about step 10, then trains the rest
    plan = make_plan(tmp_path / "plan.json", documents, sp=2, steps=steps, checkpoint_every=50, keep_checkpoints=1)
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    first = start_train(plan, run_dir, log, "--attempt", "1")
    watch = AttemptWatch(run_dir)
    try:
        wait_written(run_dir, first, 5, log)
        old = run_processes(run_dir)
        # torchrun and 2 ranks (the launcher's tag is in its environment only: started by hand)
        assert len(old) >= 3, old
        assert set(old.values()) == {"1"}, old
        watch.start()
        second = start_train(plan, run_dir, log, "--attempt", "2", "--resume")
        assert second.wait(timeout=600) == 0, log.read_text()[-3000:]
        first.wait(timeout=30)
    finally:
        watch.stop()
        for p in (first, locals().get("second")):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert gone(list(old)), "a process of attempt 1 outlived attempt 2"
    assert watch.most == 1, "the two attempts overlapped"
    assert watch.seen == {"1", "2"}, f"attempts seen: {watch.seen}"
    assert first.returncode == 75, "attempt 1 was stopped with SIGTERM and saved a checkpoint"
    text = log.read_text()
    assert "processes of an earlier attempt still run" in text
    files = metrics_files(run_dir)
    assert [f.name for f in files] == ["metrics.jsonl", "metrics.attempt-2.jsonl"]
    one = [json.loads(x)["step"] for x in files[0].read_text().splitlines()]
    two = [json.loads(x)["step"] for x in files[1].read_text().splitlines()]
    assert one == list(range(1, one[-1] + 1))
    assert one[-1] < steps
    assert two == list(range(one[-1] + 1, steps + 1)), "attempt 2 resumed from attempt 1's last checkpoint"
    assert [r["step"] for r in read_metrics(run_dir)] == list(range(1, steps + 1))
    assert json.loads(lock_file(run_dir).read_text())["attempt"] == 2


# --- the worker's half: a real Celery worker on PostgreSQL and Redis -----------------------------------------

@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A stack of its own that these tests break (its worker is killed)."""
    with own_stack(tmp_path_factory.mktemp("supervision"), ULAB_LOST_AFTER_S=str(LOST_AFTER_S)) as s:
        yield s


def submit_long(stack: Stack, corpus: Path, name: str, steps: int = LONG, **run) -> tuple[dict, Path]:
    api = stack.api_client
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    retries = run.pop("max_retries", 0)
    body = {"steps": steps, "data": {"path": str(corpus)}, **run}
    r = api.post("/api/runs", json={"plan_id": plan_id, "name": name, "max_retries": retries, "run": body})
    assert r.status_code == 201, r.text
    api.post(f"/api/runs/{r.json()['id']}/approve").raise_for_status()
    return r.json(), stack.home / "runs" / f"run-{r.json()['id']}"


def wait_stored_step(stack: Stack, run_id: int, step: int, timeout_s: float = 240) -> dict:
    """Wait until `step` is stored, and check the run is still running then (the fault must strike mid-run)."""
    end = time.monotonic() + timeout_s
    while True:
        run = stack.api_client.get(f"/api/runs/{run_id}").json()
        if run["last_step"] >= step:
            assert run["state"] == "running", run
            assert run["last_step"] < run["steps"], run
            return run
        assert time.monotonic() < end, f"step {step} not reached: {run}"
        assert run["state"] not in TERMINAL, f"step {step} not reached: {run}"
        time.sleep(0.3)


def stored_steps(stack: Stack, run_id: int, name: str = "loss") -> list[int]:
    q = stack.api_client.get(f"/api/runs/{run_id}/metrics", params={"name": name, "points": 10_000}).json()
    return q["series"][0]["step"] if q["series"] else []


def test_worker_sigkill_mid_run_stops_its_trainer_and_the_retry_stores_every_step(stack, corpus):
    """The issue's reproduction (1,500 steps, kill -9 at about step 120), scaled to 120 steps and step 40 to keep
    `make test` short (the same run shape: max_retries=1, checkpoints every 25, killed mid-run between two of them),
    then a new worker. Every process of attempt 1 is gone within seconds (the trainer gets SIGTERM when the worker
    dies and stops its ranks, which save a checkpoint); the reaper marks the run lost and queues attempt 2, which
    resumes in the same directory from a checkpoint (step 1 trained once, fewer steps than a checkpoint interval
    trained twice); never are two attempts alive at once; all 120 steps are stored once. The killed worker never
    removed its trainer's last-words file: the new worker does when it starts."""
    steps = REPRO_STEPS
    run, run_dir = submit_long(stack, corpus, "worker-killed", steps=steps,
                               checkpoint_every=REPRO_CHECKPOINT_EVERY, keep_checkpoints=2, max_retries=1)
    wait_stored_step(stack, run["id"], REPRO_KILL_AT)
    watch = AttemptWatch(run_dir)
    watch.start()
    try:
        attempt_one = run_processes(run_dir)
        assert len(attempt_one) >= 4, attempt_one  # ulab train, torchrun, 2 ranks
        words = last_words_dir() / f"ulab-run{run['id']}-attempt1-node0-{stack.worker.proc.pid}.last-words"
        os.kill(stack.worker.proc.pid, signal.SIGKILL)  # the worker only, not its process group
        stack.worker.proc.wait()
        took = seconds_until_gone(list(attempt_one), 60)
        assert took is not None, f"processes of attempt 1 still alive: {run_processes(run_dir)}"
        assert words.is_file(), "the stopped trainer said nothing in its last-words file"
        end = time.monotonic() + LOST_AFTER_S + 30  # the reaper marks attempt 1 lost and queues attempt 2
        while not (lost := stack.api_client.get(f"/api/runs/{run['id']}").json())["attempts"]:
            assert time.monotonic() < end, f"the run was not marked lost: {lost}"
            time.sleep(0.5)
        assert lost["attempts"][0]["state"] == "lost", lost
        assert lost["state"] == "queued"
        assert lost["attempt"] == 2  # a retry is left
        stack.worker.start()
        stack.wait_worker_ready()
        assert not words.exists(), "the new worker left the killed worker's last-words file"
        done = wait_for(stack.api_client, run["id"], {"succeeded"}, timeout_s=900)
    finally:
        watch.stop()
        if stack.worker.proc.poll() is not None:  # failed before the restart: the next tests need a worker
            stack.worker.start()
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert stored_steps(stack, run["id"]) == list(range(1, steps + 1))
    assert stored_steps(stack, run["id"], "grad_norm") == list(range(1, steps + 1))
    assert watch.most == 1, "two attempts were alive at once"
    assert watch.seen == {"1", "2"}, f"attempts seen: {watch.seen}"
    files = metrics_files(run_dir)
    assert [f.name for f in files] == ["metrics.jsonl", "metrics.attempt-2.jsonl"]
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines() if x.strip()]
    assert sum(x["step"] == 1 for x in lines) == 1, "attempt 2 started from scratch instead of a checkpoint"
    redone = len(lines) - steps
    assert 0 <= redone < REPRO_CHECKPOINT_EVERY, f"{redone} steps trained twice"
    assert done["attempts"][0]["last_step"] < steps, "attempt 1 finished before its worker was killed"
    assert run_processes(run_dir) == {}
    print(f"worker SIGKILL -> no process of attempt 1 left: {took:.1f} s")


def test_trainer_sigkill_leaves_no_rank_and_the_reason_names_the_signal(stack, corpus):
    run, run_dir = submit_long(stack, corpus, "trainer-killed")
    wait_stored_step(stack, run["id"], 3)
    ranks = rank_pids(run_dir)
    assert len(ranks) == 2
    worker = stack.worker.proc.pid
    launcher = [pid for pid in run_processes(run_dir) if psutil.Process(pid).ppid() == worker]
    assert len(launcher) == 1
    # the worker speaks HTTP only, with its own token; the trainer's processes get neither token nor broker
    assert "ULAB_DATABASE_URL" not in environ(worker)
    assert environ(worker)["ULAB_WORKER_TOKEN"]
    for pid in run_processes(run_dir):
        held = set(environ(pid)) & {"ULAB_DATABASE_URL", "ULAB_WORKER_TOKEN", "ULAB_BROKER_URL", "ULAB_ATTEMPT_TOKEN"}
        assert not held, (pid, held)
    os.kill(launcher[0], signal.SIGKILL)
    took = seconds_until_gone(ranks, 60)
    assert took is not None, f"ranks {ranks} outlived the trainer"
    final = wait_for(stack.api_client, run["id"], {"failed"}, timeout_s=120)
    assert final["exit_reason"].startswith("the trainer was killed by SIGKILL"), final["exit_reason"]
    assert "Warning" not in final["exit_reason"]
    assert run_processes(run_dir) == {}
    print(f"trainer SIGKILL -> ranks gone: {took:.1f} s")


def test_cancel_of_a_stuck_run_leaves_no_process(stack, corpus):
    """Stuck: torchrun and both ranks are stopped (SIGSTOP), so none of them answers SIGTERM, as when a rank
    hangs in a collective or a huge model's set-up. The cancel still ends every one of them, by pid."""
    run, run_dir = submit_long(stack, corpus, "stuck", stop_grace_s=3)
    wait_stored_step(stack, run["id"], 3)
    procs = run_processes(run_dir)
    worker = stack.worker.proc.pid
    stuck = [pid for pid in procs if psutil.Process(pid).ppid() != worker]  # torchrun and the ranks
    assert len(stuck) == 3
    assert len(rank_pids(run_dir)) == 2
    for pid in stuck:
        os.kill(pid, signal.SIGSTOP)
    cancelled_at = time.monotonic()
    assert stack.api_client.post(f"/api/runs/{run['id']}/cancel").status_code == 200
    took = seconds_until_gone(list(procs), 120)
    assert took is not None, f"still alive after cancel: {run_processes(run_dir)}"
    final = wait_for(stack.api_client, run["id"], {"cancelled"}, timeout_s=60)
    assert final["exit_reason"] == "cancelled by request"
    print(f"cancel of a stuck run -> all gone: {time.monotonic() - cancelled_at:.1f} s")
