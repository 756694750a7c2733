"""Fault tests of the run lifecycle against real processes: a worker killed mid-run, the broker flushed with runs
queued, the same task delivered twice, and the API down for 20 s while a run ships metrics."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services import REPO, Stack, forget_messages, postgres_database, redis_database, wait_http
from tests.tiny import submit, tiny_plan, wait_for
from worker.trainer.attempt import metrics_files

pytestmark = pytest.mark.slow
LOST_AFTER_S = 8
RESEND_AFTER_S = 3


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    """A stack of its own (database, Redis db, API, worker) that these tests may break."""
    with postgres_database() as pg, redis_database() as broker:
        s = Stack(tmp_path_factory.mktemp("faults"), pg, broker, ULAB_LOST_AFTER_S=str(LOST_AFTER_S),
                  ULAB_RESEND_AFTER_S=str(RESEND_AFTER_S)).start()
        s.broker = broker
        s.api_client = s.client()
        yield s
        s.api_client.close()
        s.stop()


def steps_of(api, run_id: int, name: str = "loss") -> list[int]:
    q = api.get(f"/api/runs/{run_id}/metrics", params={"name": name, "points": 10_000}).json()
    return q["series"][0]["step"] if q["series"] else []


def attempt_starts(run_dir: str) -> int:
    with open(f"{run_dir}/train.log") as f:
        return sum(line.startswith("--- attempt") for line in f)


def send_task(stack: Stack, run_id: int) -> None:
    """Put one more "execute run N" message on the broker, as a redelivery would."""
    subprocess.run([sys.executable, "-c", f"from backend.core.queue import send_execute_run; "
                    f"send_execute_run({run_id}, 'H100-80GB')"], env=stack.env, cwd=REPO, check=True, timeout=60)


def wait_step(api, run_id: int, step: int, timeout_s: float = 180) -> None:
    end = time.monotonic() + timeout_s
    while api.get(f"/api/runs/{run_id}").json()["last_step"] < step:
        assert time.monotonic() < end, f"run {run_id} did not reach step {step}"
        time.sleep(0.3)


def test_flushed_broker_and_duplicate_messages_still_run_each_run_once(faults, corpus):
    api = faults.api_client
    faults.worker.stop()
    runs = [submit(api, tiny_plan(), {"steps": 4, "data": {"path": str(corpus)}}, name=f"queued-{i}") for i in range(2)]
    assert all(r["state"] == "queued" for r in runs)
    forget_messages(faults.broker)  # the broker forgets every queued message
    faults.api.stop()
    faults.api.start()  # on start-up the API re-sends what the database says is queued
    wait_http(f"{faults.url}/api/health", 60, faults.api.proc, faults.api.log)
    send_task(faults, runs[0]["id"])  # and the same message twice more: a redelivery
    send_task(faults, runs[0]["id"])
    faults.worker.start()
    faults.wait_worker_ready()
    for r in runs:
        done = wait_for(api, r["id"], {"succeeded"}, timeout_s=240)
        assert done["attempt"] == 1 and len(done["attempts"]) == 1
        assert attempt_starts(f"{faults.home}/runs/run-{r['id']}") == 1, "the trainer started more than once"
        assert steps_of(api, r["id"]) == [1, 2, 3, 4]
    time.sleep(2)  # let the worker take the duplicate messages
    log = faults.worker.log.read_text()
    assert log.count(f"run {runs[0]['id']} is not queued") >= 2


def test_flushed_broker_queued_run_starts_without_an_api_restart(faults, corpus):
    """The API's supervision loop re-sends a run that stayed queued past ULAB_RESEND_AFTER_S; the re-sends that
    pile up while no worker listens start it once (the claim in the database)."""
    api = faults.api_client
    faults.worker.stop()
    api_pid = faults.api.proc.pid
    run = submit(api, tiny_plan(), {"steps": 4, "data": {"path": str(corpus)}}, name="flushed-no-restart")
    forget_messages(faults.broker)  # the message is gone; the API keeps running
    time.sleep(RESEND_AFTER_S * 3)  # several re-sends while no worker listens: duplicates on the queue
    assert api.get(f"/api/runs/{run['id']}").json()["state"] == "queued"
    faults.worker.start()
    faults.wait_worker_ready()
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=240)
    assert faults.api.proc.pid == api_pid and faults.api.proc.poll() is None, "the API was restarted"
    assert done["attempt"] == 1 and len(done["attempts"]) == 1
    assert attempt_starts(f"{faults.home}/runs/run-{run['id']}") == 1, "the trainer started more than once"
    assert steps_of(api, run["id"]) == [1, 2, 3, 4]
    assert f"re-sent queued runs no worker claimed within ULAB_RESEND_AFTER_S: [{run['id']}]" in \
        faults.api.log.read_text()


def last_step_written(metrics_file: Path) -> int:
    if not metrics_file.is_file():
        return 0
    lines = [x for x in metrics_file.read_text().splitlines() if x.strip()]
    return json.loads(lines[-1])["step"] if lines else 0


def test_api_down_for_20s_loses_no_metric_point(faults, corpus):
    """The API goes away mid-run and stays away until the trainer has finished and the worker has been draining
    for longer than the reaper's limit: the worker keeps beating while it waits, so the run is not marked
    lost, and every point reaches the database once the API is back."""
    api, steps = faults.api_client, 40
    run = submit(api, tiny_plan(), {"steps": steps, "data": {"path": str(corpus)}}, name="api-outage")
    wait_step(api, run["id"], 3)
    faults.api.stop(sig=signal.SIGKILL)
    down_at = time.monotonic()
    metrics_file = Path(faults.home) / "runs" / f"run-{run['id']}" / "metrics.jsonl"
    while last_step_written(metrics_file) < steps:
        assert time.monotonic() - down_at < 300, "the trainer did not finish while the API was down"
        time.sleep(0.5)
    trainer_done = time.monotonic()
    time.sleep(max(20 - (trainer_done - down_at), LOST_AFTER_S + 4))
    faults.api.start()
    wait_http(f"{faults.url}/api/health", 60, faults.api.proc, faults.api.log)
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=120)
    assert [a["state"] for a in done["attempts"]] == ["succeeded"]
    assert steps_of(api, run["id"]) == list(range(1, steps + 1))
    assert steps_of(api, run["id"], "grad_norm") == list(range(1, steps + 1))


def test_killed_worker_run_is_lost_then_resumed_from_its_checkpoint(faults, corpus):
    api = faults.api_client
    # 80 steps: when the test sees step 12 the trainer may be ~10 steps further on (last_step arrives with the
    # heartbeat), and it must still be mid-run when its worker dies
    steps = 80
    body = {"steps": steps, "checkpoint_every": 5, "keep_checkpoints": 2, "data": {"path": str(corpus)}}
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    run = api.post("/api/runs", json={"plan_id": plan_id, "name": "killed", "max_retries": 1, "run": body}).json()
    api.post(f"/api/runs/{run['id']}/approve").raise_for_status()
    wait_step(api, run["id"], 12)
    killed_at = time.monotonic()
    faults.worker.stop(sig=signal.SIGKILL)
    lost_seen = None
    while time.monotonic() - killed_at < LOST_AFTER_S + 20:
        r = api.get(f"/api/runs/{run['id']}").json()
        if r["attempts"] and r["attempts"][0]["state"] == "lost":
            lost_seen = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    assert lost_seen is not None, "the run was not marked lost"
    assert r["state"] == "queued" and r["attempt"] == 2  # retries allowed: the next attempt is queued
    faults.worker.start()
    faults.wait_worker_ready()
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert done["attempts"][0]["last_step"] < steps, "attempt 1 finished before its worker was killed"
    assert steps_of(api, run["id"]) == list(range(1, steps + 1))  # no gap, no duplicate
    files = metrics_files(Path(faults.home) / "runs" / f"run-{run['id']}")  # one per attempt
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines() if x.strip()]
    # attempt 2 continued from a checkpoint: step 1 was trained once, and at most the steps since the last
    # checkpoint (every 5; on SIGTERM one more) were trained twice
    assert sum(x["step"] == 1 for x in lines) == 1, "attempt 2 started from scratch instead of the checkpoint"
    redone = len(lines) - steps
    assert 0 <= redone < 5, f"{redone} steps trained twice"
    print(f"lost after {lost_seen:.1f} s; attempt 1 reached step {done['attempts'][0]['last_step']}; "
          f"{redone} steps redone by attempt 2")
