"""How fast a run's processes are gone after a fault, against real ones: a Celery worker (Redis, PostgreSQL), `ulab
train`, torchrun and 2 CPU ranks of the tiny model on 1,500-step runs, each fault struck mid-run (step >= 3).

- worker SIGKILL -> no process of the attempt left (the trainer gets SIGTERM from the kernel and stops its ranks,
  which save a checkpoint first);
- trainer SIGKILL -> both ranks gone (torchrun gets SIGTERM from the kernel; the worker kills what is left);
- cancel of a stuck run (torchrun and the ranks SIGSTOPped, stop_grace_s 3) -> all gone (`ulab train` kills
  them 5 s after the 3 s grace).

Prints each figure and the median; asserts nothing (tests/integration/test_supervision.py checks the behaviour).
Usage: .venv/bin/python bench/supervision.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import psutil

from tests.integration.test_supervision import (
    LOST_AFTER_S,
    rank_pids,
    run_processes,
    seconds_until_gone,
    submit_long,
    wait_stored_step,
)
from tests.services import Stack, postgres_database, redis_database
from tests.tiny import write_corpus


def worker_kill(stack: Stack, corpus: Path) -> float | None:
    run, run_dir = submit_long(stack, corpus, "bench-worker-kill")
    wait_stored_step(stack, run["id"], 3)
    procs = list(run_processes(run_dir))
    os.kill(stack.worker.proc.pid, signal.SIGKILL)
    stack.worker.proc.wait()
    took = seconds_until_gone(procs, 120)
    stack.worker.start()
    stack.wait_worker_ready()
    return took


def trainer_kill(stack: Stack, corpus: Path) -> float | None:
    run, run_dir = submit_long(stack, corpus, "bench-trainer-kill")
    wait_stored_step(stack, run["id"], 3)
    ranks = rank_pids(run_dir)
    launcher = [p for p in run_processes(run_dir) if psutil.Process(p).ppid() == stack.worker.proc.pid]
    os.kill(launcher[0], signal.SIGKILL)
    return seconds_until_gone(ranks, 120)


def stuck_cancel(stack: Stack, corpus: Path) -> float | None:
    run, run_dir = submit_long(stack, corpus, "bench-stuck", stop_grace_s=3)
    wait_stored_step(stack, run["id"], 3)
    procs = run_processes(run_dir)
    for pid in procs:
        if psutil.Process(pid).ppid() != stack.worker.proc.pid:
            os.kill(pid, signal.SIGSTOP)
    stack.api_client.post(f"/api/runs/{run['id']}/cancel").raise_for_status()
    return seconds_until_gone(list(procs), 120)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with postgres_database() as pg, redis_database(14) as broker, tempfile.TemporaryDirectory() as home:
        corpus = write_corpus(Path(home) / "tiny.txt")
        stack = Stack(Path(home) / "stack", pg, broker, ULAB_LOST_AFTER_S=str(LOST_AFTER_S)).start()
        stack.api_client = stack.client()
        try:
            for name, fault in (("worker SIGKILL -> no process of the attempt left", worker_kill),
                                ("trainer SIGKILL -> both ranks gone", trainer_kill),
                                ("cancel of a stuck run (grace 3 s) -> all gone", stuck_cancel)):
                figures = []
                for _ in range(args.repeat):
                    took = fault(stack, corpus)
                    figures.append(took)
                    time.sleep(1)
                shown = ", ".join("not gone in 120 s" if f is None else f"{f:.1f} s" for f in figures)
                done = [f for f in figures if f is not None]
                median = f"median {statistics.median(done):.1f} s" if done else "no figure"
                print(f"{name}: {median} ({shown})", flush=True)
        finally:
            stack.api_client.close()
            stack.stop()


if __name__ == "__main__":
    main()
