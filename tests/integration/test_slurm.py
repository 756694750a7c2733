"""Runs on a real Slurm: munged, slurmctld and slurmd on this machine (tests/slurm_cluster.py, one node,
2 CPUs, no GPUs), the API with the H100 queue on the Slurm executor, and the CPU trainer with 2 ranks in the job.
One cluster and one API serve the whole module; the runs are tiny. Slurm cannot simulate several nodes here:
the two-node script and the node-list parsing are tested in tests/unit/test_jobscript.py."""
from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.e2e.browser import COOKIE, chromium_page
from tests.services import Stack, postgres_database, wait_http
from tests.slurm_cluster import missing, slurm_cluster
from tests.tiny import environ, submit, tiny_plan, trainer_pids, wait_for
from worker.trainer.attempt import metrics_files

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = missing()
    if why:
        pytest.fail(f"Slurm is needed for these tests: {why}")
    started = time.monotonic()
    with slurm_cluster(tmp_path_factory.mktemp("slurm")) as c:
        print(f"Slurm cluster up in {time.monotonic() - started:.1f} s")
        yield c


@pytest.fixture(scope="module")
def slurm_stack(tmp_path_factory, cluster, redis_url):
    home = tmp_path_factory.mktemp("slurm-stack")
    with postgres_database() as pg:
        s = Stack(home, pg, redis_url, worker=False, SLURM_CONF=str(cluster.conf),
                  ULAB_EXECUTOR_GPU_H100_80GB="slurm", ULAB_SLURM_PARTITION="debug", ULAB_SLURM_GPUS="false",
                  ULAB_SLURM_SHARED_DIR=str(home / "cluster-fs"), ULAB_SLURM_POLL_S="0.5",
                  ULAB_CALIBRATION_DIR=str(home / "results")).start()
        try:
            yield s
        finally:
            s.stop()


@pytest.fixture(scope="module")
def api(slurm_stack):
    with slurm_stack.client() as client:
        yield client


def job_state(cluster, job_id: str) -> str:
    out = cluster.scontrol("show", "job", "-o", job_id).stdout
    return out.split("JobState=")[1].split()[0] if "JobState=" in out else "?"


def steps_of(api: httpx.Client, run_id: int, name: str = "loss") -> list[int]:
    q = api.get(f"/api/runs/{run_id}/metrics", params={"name": name, "points": 10_000}).json()
    return q["series"][0]["step"] if q["series"] else []


def written_step(run_dir: Path) -> int:
    """The last step the job wrote to its run directory on the shared file system (0: none yet)."""
    lines = [x for f in metrics_files(run_dir) for x in f.read_text().split("\n")[:-1]]  # whole lines only
    return max((json.loads(x)["step"] for x in lines if x.strip()), default=0)


def wait_step(api: httpx.Client, run_id: int, step: int, timeout_s: float = 180) -> dict:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        run = api.get(f"/api/runs/{run_id}").json()
        if run["last_step"] >= step:
            return run
        assert run["state"] in ("queued", "starting", "running"), run
        time.sleep(0.3)
    raise TimeoutError(f"run {run_id} did not reach step {step}")


def test_approved_run_goes_pending_running_completed_with_its_metrics(slurm_stack, cluster, api, corpus):
    """Also: the API (and its poller) restarts mid-run and the run is still followed."""
    plan_id = api.post("/api/plans", json=tiny_plan(sp_size=2)).json()["id"]
    r = api.post("/api/runs", json={"plan_id": plan_id, "name": "slurm $(touch /tmp/pwned) `id`", "run": {
        "steps": 30, "data": {"path": str(corpus)}}})
    assert r.status_code == 201, r.text
    run = r.json()
    assert run["executor"] == "slurm"
    assert run["slurm_job_id"] is None
    approved_at = time.monotonic()
    run = api.post(f"/api/runs/{run['id']}/approve").json()
    assert run["state"] == "queued", "approval submits the job at once"
    assert run["slurm_job_id"], "approval submits the job at once"
    job_id = run["slurm_job_id"]
    running_after = None
    while running_after is None:
        got = api.get(f"/api/runs/{run['id']}").json()
        if got["state"] == "running":
            running_after = time.monotonic() - approved_at
        assert got["state"] in ("queued", "starting", "running"), got
        assert time.monotonic() - approved_at < 120, got
        time.sleep(0.1)
    assert got["slurm_nodes"] == cluster.host
    assert got["slurm_job_id"] == job_id
    assert got["worker"] == f"slurm job {job_id} on {cluster.host}"
    seen = wait_step(api, run["id"], 2)["last_step"]
    # the API goes away mid-run, the job trains on without it (a step the API has not seen is written), and the API
    # comes back: its poller takes the job up again from the database
    slurm_stack.api.stop()
    run_dir = slurm_stack.home / "cluster-fs" / f"run-{run['id']}"
    end = time.monotonic() + 60
    while written_step(run_dir) < min(seen + 1, 30):
        assert time.monotonic() < end, f"no step written in 60 s while the API was down (API saw {seen})"
        time.sleep(0.1)
    slurm_stack.api.start()
    wait_http(f"{slurm_stack.url}/api/health", 60, slurm_stack.api.proc, slurm_stack.api.log)
    completed_at = succeeded_after = None
    end = time.monotonic() + 240
    while succeeded_after is None and time.monotonic() < end:
        state = job_state(cluster, job_id)
        if state == "COMPLETED" and completed_at is None:
            completed_at = time.monotonic()
        got = api.get(f"/api/runs/{run['id']}").json()
        if got["state"] == "succeeded":
            succeeded_after = time.monotonic() - (completed_at or time.monotonic())
        assert got["state"] in ("running", "succeeded"), got
        time.sleep(0.1)
    assert got["state"] == "succeeded", got
    assert got["exit_reason"] is None
    assert got["slurm_state"] == "COMPLETED"
    assert got["last_step"] == 30
    assert steps_of(api, run["id"]) == list(range(1, 31)), "every step's metrics reached the API"
    ranks = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "peak_allocated_gib"}).json()["series"]
    assert [s["rank"] for s in ranks] == [0, 1]  # two CPU ranks in the job
    assert not Path("/tmp/pwned").exists()
    assert api.get(f"/api/runs/{run['id']}/log").json()["lines"]
    with chromium_page(signed_in=False) as page:  # the run page: job id, Slurm state and node list, the metrics
        page.context.add_cookies([{"name": COOKIE, "value": slurm_stack.admin_token, "url": slurm_stack.url}])
        page.goto(f"{slurm_stack.url}/#/runs/{run['id']}")
        page.wait_for_function("document.querySelector('[data-testid=loss-chart]')?.dataset.points === '30'",
                               timeout=20_000)
        shown = page.locator("[data-testid=slurm-job]").inner_text()
        assert shown == f"Slurm job {job_id} COMPLETED on {cluster.host}", shown
    # Slurm's EndTime has whole seconds: the API's finished_at minus it is the latency to within a second
    end_time = cluster.scontrol("show", "job", "-o", job_id).stdout.split("EndTime=")[1].split()[0]
    finished = datetime.fromisoformat(got["finished_at"]).astimezone().replace(tzinfo=None)
    print(f"approval -> running {running_after:.2f} s; Slurm COMPLETED -> succeeded {succeeded_after:.2f} s after "
          f"this test saw COMPLETED, {(finished - datetime.fromisoformat(end_time)).total_seconds():.2f} s after "
          f"Slurm's EndTime ({end_time}, whole seconds)")


def test_cancel_terms_the_job_then_cancels_it(slurm_stack, cluster, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 100000, "data": {"path": str(corpus)}}, name="slurm-cancel")
    run = wait_step(api, run["id"], 2)
    job_id = run["slurm_job_id"]
    pids = trainer_pids(f"run-{run['id']}/")
    assert len(pids) >= 3  # ulab job's trainer: launcher + 2 ranks
    # the job reaches the service over HTTP with its attempt's token alone; its trainer holds no token at all
    envs = {pid: environ(pid) for pid in pids}
    job = {pid for pid in pids if b"\0job\0" in Path(f"/proc/{pid}/cmdline").read_bytes()}  # srun, `ulab job`
    assert job, envs.keys()
    assert len(job) < len(pids), envs.keys()
    for pid, env in envs.items():
        assert not {"ULAB_DATABASE_URL", "ULAB_BROKER_URL", "ULAB_WORKER_TOKEN"} & set(env), pid
        if pid in job:
            assert env["ULAB_ATTEMPT_TOKEN"].startswith("ulab_attempt_"), pid
        else:  # the trainer: launcher, torchrun, ranks
            assert "ULAB_ATTEMPT_TOKEN" not in env, pid
    assert api.post(f"/api/runs/{run['id']}/cancel").json()["cancel_requested"] is True
    final = wait_for(api, run["id"], {"cancelled"}, timeout_s=90)
    assert final["exit_reason"] == "cancelled by request"
    assert job_state(cluster, job_id) in ("FAILED", "CANCELLED", "COMPLETED")
    end = time.monotonic() + 30
    while trainer_pids(f"run-{run['id']}/") and time.monotonic() < end:
        time.sleep(0.3)
    assert trainer_pids(f"run-{run['id']}/") == []
    # the trainer stopped on SIGTERM (it saved a checkpoint), not on the later scancel's SIGKILL
    log = "\n".join(api.get(f"/api/runs/{run['id']}/log", params={"lines": 5000}).json()["lines"])
    assert "SIGTERM" in log or "preempted" in log, log[-2000:]


def test_cancel_while_pending_cancels_the_job(slurm_stack, cluster, api, corpus):
    plan_id = api.post("/api/plans", json=tiny_plan(sp_size=2)).json()["id"]
    run = api.post("/api/runs", json={"plan_id": plan_id, "name": "held", "slurm_time_limit": "5",
                                      "run": {"steps": 5, "data": {"path": str(corpus)}}}).json()
    run = api.post(f"/api/runs/{run['id']}/approve").json()
    job_id = run["slurm_job_id"]
    assert "TimeLimit=00:05:00" in cluster.scontrol("show", "job", "-o", job_id).stdout  # the run's own limit
    final = api.post(f"/api/runs/{run['id']}/cancel").json()
    assert final["state"] == "cancelled"
    end = time.monotonic() + 30
    while job_state(cluster, job_id) not in ("CANCELLED", "COMPLETED", "FAILED") and time.monotonic() < end:
        time.sleep(0.3)
    assert job_state(cluster, job_id) == "CANCELLED"


def test_failing_plan_ends_failed_with_the_reason(slurm_stack, api, tmp_path):
    corpus = tmp_path / "no-such-corpus.txt"
    corpus.write_text("gone before the job reads it\n")  # approval checks the data exists
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}}, name="slurm-fails",
                 approve=False)
    assert api.post(f"/api/runs/{run['id']}/approve").status_code == 200  # sbatch: the job starts a second later
    corpus.unlink()
    final = wait_for(api, run["id"], {"failed"}, timeout_s=120)
    assert final["slurm_state"] == "FAILED"
    assert final["exit_reason"].startswith(f"Slurm job {final['slurm_job_id']} FAILED, exit code 2")
    assert "no-such-corpus.txt" in final["exit_reason"]


def test_bad_partition_override_is_refused_naming_the_field(api, corpus):
    plan_id = api.post("/api/plans", json=tiny_plan(sp_size=2)).json()["id"]
    r = api.post("/api/runs", json={"plan_id": plan_id, "slurm_partition": "debug; rm -rf /",
                                    "run": {"steps": 5, "data": {"path": str(corpus)}}})
    assert r.status_code == 422
    assert "slurm_partition" in r.text


def test_requeue_resumes_from_the_checkpoint_with_no_step_lost_or_repeated(slurm_stack, cluster, api, corpus):
    """`scontrol requeue` stands in for a preemption: SIGTERM (the trainer checkpoints), the job goes back to
    PENDING under the same id, the attempt is lost, and the next attempt resumes in the same job."""
    # enough steps that the requeue strikes mid-run: the tiny model trains a step in 20-30 ms on an idle machine, and
    # 40 steps once ended before the requeue's SIGTERM (attempt 2 then trained all 40 again from step 1)
    steps = 200
    plan_id = api.post("/api/plans", json=tiny_plan(sp_size=1)).json()["id"]
    run = api.post("/api/runs", json={"plan_id": plan_id, "name": "requeued", "max_retries": 1, "run": {
        "steps": steps, "checkpoint_every": 1000, "data": {"path": str(corpus)}}}).json()
    run = api.post(f"/api/runs/{run['id']}/approve").json()
    job_id = run["slurm_job_id"]
    run_dir = slurm_stack.home / "cluster-fs" / f"run-{run['id']}"
    end = time.monotonic() + 180
    while written_step(run_dir) < 5:  # the job's own file: the API's step follows a heartbeat behind
        assert time.monotonic() < end, f"run {run['id']} wrote no step 5"
        time.sleep(0.05)
    r = subprocess.run(["scontrol", "requeue", job_id], env=cluster.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # the attempt is lost and the next one queued under the same job
    requeued = wait_for(api, run["id"], {"queued"}, timeout_s=60)
    assert requeued["attempt"] == 2
    assert requeued["slurm_job_id"] == job_id
    # Slurm holds a requeued job for about two minutes (Reason=BeginTime) once it is pending again: start it now
    end = time.monotonic() + 120
    while api.get(f"/api/runs/{run['id']}").json()["state"] == "queued":
        assert time.monotonic() < end, cluster.scontrol("show", "job", "-o", job_id).stdout
        if "Reason=BeginTime" in cluster.scontrol("show", "job", "-o", job_id).stdout:
            cluster.scontrol("update", f"JobId={job_id}", "StartTime=now")
        time.sleep(0.3)
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)
    assert [a["state"] for a in done["attempts"]] == ["lost", "succeeded"]
    assert done["attempt"] == 2
    assert done["slurm_job_id"] == job_id  # the same job served both attempts
    assert "requeued" in done["attempts"][0]["exit_reason"]
    assert steps_of(api, run["id"]) == list(range(1, steps + 1))
    # each start of the job writes its own metrics file (worker/trainer/attempt.py): read them oldest first
    files = metrics_files(run_dir)
    assert len(files) == 2, files
    first = [json.loads(x)["step"] for x in files[0].read_text().splitlines() if x.strip()]
    assert 5 <= first[-1] < steps, f"attempt 1 reached step {first[-1]} of {steps} before the requeue stopped it"
    lines = [json.loads(x) for f in files for x in f.read_text().splitlines() if x.strip()]
    # checkpoints only on SIGTERM (checkpoint_every 1000): attempt 2 went on from the step attempt 1 saved
    assert [x["step"] for x in lines] == list(range(1, steps + 1)), "a step was lost or trained twice"
    print(f"attempt 1 stopped at step {done['attempts'][0]['last_step']}")


# the fields a stored probe carries, whichever executor ran it (the Celery path: tests/e2e/test_dashboard_probe.py)
PROBE_FIELDS = {"plan_depth", "depths", "device", "world", "gpu", "gpu_capacity_gib", "tokens_per_step", "measured",
                "extrapolated", "fits", "source", "check", "predicted", "verdict", "warnings", "wall_s", "run_id"}


def test_a_probe_through_slurm_stores_the_same_fields_as_through_celery(slurm_stack, cluster, api):
    """POST /api/plans/{id}/probe on the Slurm executor: the job runs worker.probe (every depth in one torchrun of
    2 CPU ranks), and the result is stored with the plan and in the calibration store."""
    plan = tiny_plan(sp_size=2, seq_len=256)
    plan["model"]["config"]["num_hidden_layers"] = 3
    plan_id = api.post("/api/plans", json={"name": "slurm-probe", **plan}).json()["id"]
    r = api.post(f"/api/plans/{plan_id}/probe", json={"depths": [1, 2], "steps": 3})
    assert r.status_code in (200, 201, 202), r.text
    run = r.json()
    assert run["kind"] == "probe", run
    assert run["executor"] == "slurm", run
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=420)
    assert done["slurm_job_id"]
    assert job_state(cluster, done["slurm_job_id"]) in ("COMPLETED", "?")
    stored = api.get(f"/api/plans/{plan_id}").json()["probe"]
    assert set(stored) == PROBE_FIELDS, set(stored) ^ PROBE_FIELDS
    assert stored["run_id"] == run["id"]
    assert stored["plan_depth"] == 3
    assert stored["depths"] == [1, 2]
    assert stored["device"] == "cpu"
    assert stored["world"] == 2
    assert [m["status"] for m in stored["measured"]] == ["ok", "ok"]
    assert all(len(m["ranks"]) == 2 and m["loss_finite"] for m in stored["measured"])
    assert stored["extrapolated"]["peak_allocated_gib"] > 0
    assert stored["predicted"]["peak_allocated_gib"] > 0
    assert stored["source"]["peak_allocated_gib"] == "extrapolated"
    assert stored["verdict"]["text"].startswith("measured: fits with")
    points = [p for p in api.get("/api/calibration").json()["points"] if p["run_id"] == run["id"]]
    assert [(p["source"], p["gpu"]) for p in points] == [("probe", "cpu")]
    print("slurm probe:", stored["verdict"]["text"], "in", stored["wall_s"], "s")
