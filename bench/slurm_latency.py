"""How fast Slurm runs move on the dashboard: a one-node Slurm cluster of its own (tests/slurm_cluster.py;
root, slurm-wlm and munge installed: `make slurm`), the API with the H100 queue on the Slurm executor, and tiny
runs (torchrun, 2 CPU ranks in the job). For each run it prints
  - approval -> running: from sending the approve call (which runs sbatch) to the API first answering
    `running` (polled at 20 Hz);
  - COMPLETED -> succeeded: from this script first seeing COMPLETED in `scontrol show job` to the API answering
    `succeeded` (both polled in one 20 Hz loop), and the API's finished_at minus Slurm's EndTime (whole seconds).
The poller reads Slurm every ULAB_SLURM_POLL_S (default here 1.0 s, the setting's default).

Usage: .venv/bin/python bench/slurm_latency.py [--runs 3] [--steps 10] [--poll 1.0]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.services import Stack, postgres_database
from tests.slurm_cluster import missing, slurm_cluster
from tests.tiny import tiny_plan, write_corpus


def one_run(api, cluster, corpus: Path, steps: int) -> tuple[float, float, float]:
    plan_id = api.post("/api/plans", json=tiny_plan()).json()["id"]
    run = api.post("/api/runs", json={"plan_id": plan_id, "name": "latency",
                                      "run": {"steps": steps, "data": {"path": str(corpus)}}}).json()
    approved = time.monotonic()  # the approve call includes sbatch
    job_id = api.post(f"/api/runs/{run['id']}/approve").json()["slurm_job_id"]
    running = completed = succeeded = None
    got: dict = {}
    while succeeded is None:
        if completed is None and "JobState=COMPLETED" in cluster.scontrol("show", "job", "-o", job_id).stdout:
            completed = time.monotonic()
        got = api.get(f"/api/runs/{run['id']}").json()
        if running is None and got["state"] in ("running", "succeeded"):
            running = time.monotonic()
        if got["state"] == "succeeded":
            succeeded = time.monotonic()
        elif got["state"] not in ("queued", "starting", "running"):
            raise SystemExit(f"run {run['id']} ended {got['state']}: {got['exit_reason']}")
        time.sleep(0.05)
    end_time = cluster.scontrol("show", "job", "-o", job_id).stdout.split("EndTime=")[1].split()[0]
    finished = datetime.fromisoformat(got["finished_at"]).astimezone().replace(tzinfo=None)
    assert running is not None
    return running - approved, succeeded - (completed or succeeded), \
        (finished - datetime.fromisoformat(end_time)).total_seconds()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--poll", type=float, default=1.0)
    args = ap.parse_args()
    why = missing()
    if why:
        raise SystemExit(f"no Slurm here: {why}")
    with tempfile.TemporaryDirectory() as tmp, postgres_database() as pg:
        home = Path(tmp)
        with slurm_cluster(home / "slurm") as cluster:
            stack = Stack(home / "stack", pg, "", worker=False, SLURM_CONF=str(cluster.conf),
                          ULAB_EXECUTOR_GPU_H100_80GB="slurm", ULAB_SLURM_GPUS="false",
                          ULAB_SLURM_SHARED_DIR=str(home / "cluster-fs"), ULAB_SLURM_POLL_S=str(args.poll)).start()
            try:
                corpus = write_corpus(home / "data" / "corpus.txt")
                rows = []
                with stack.client() as api:
                    for i in range(args.runs):
                        rows.append(one_run(api, cluster, corpus, args.steps))
                        print(f"run {i + 1}: approval -> running {rows[-1][0]:.2f} s; COMPLETED -> succeeded "
                              f"{rows[-1][1]:.2f} s after this script saw it, {rows[-1][2]:.2f} s after EndTime",
                              flush=True)
            finally:
                stack.stop()
    for k, name in enumerate(("approval -> running", "COMPLETED seen -> succeeded", "EndTime -> finished_at")):
        values = [r[k] for r in rows]
        print(f"{name}: median {statistics.median(values):.2f} s, max {max(values):.2f} s "
              f"(poll every {args.poll} s, {args.runs} runs)")


if __name__ == "__main__":
    main()
