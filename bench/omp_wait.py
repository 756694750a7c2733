"""What OpenMP's wait policy does to CPU ranks that share their cores: the figures behind worker/__init__.py's
OMP_WAIT_POLICY=PASSIVE default.

Trains the tiny Llama of tests/tiny.py (one CPU rank, its threads as the trainer gives them: the cores // ranks)
`--steps` steps: alone, then `--jobs` runs at once (what two test processes, a second job or a busy worker bring),
once with libgomp's own default (idle threads spin, OMP_WAIT_POLICY=ACTIVE: the variable is set explicitly, since
the package's default would otherwise apply) and once with PASSIVE (idle threads sleep). Prints the median step
(steps after the 5th) of every run and each case's ratio to the lone default run. The machine is whatever runs it:
the figures say so only for where they were measured.
Usage: .venv/bin/python bench/omp_wait.py [--steps 120] [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny import write_run_plan  # noqa: E402

ULAB = Path(sys.executable).parent / "ulab"


def median_steps(run_dirs: list[Path], plan: Path, policy: str) -> list[float]:
    """Start one `ulab train` per run directory at once under `policy`; answer each run's median step (s)."""
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    procs = [subprocess.Popen([str(ULAB), "train", "--plan", str(plan), "--run-dir", str(d)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for d in run_dirs]
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"ulab train exited {p.returncode}: {err[-2000:]}")
    out = []
    for d in run_dirs:
        steps = [json.loads(x)["step_time_s"] for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        out.append(statistics.median(steps[5:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        plan = write_run_plan(tmp, args.steps, sp_size=1)
        print(f"tiny Llama, 1 CPU rank per run, {args.steps} steps, {os.cpu_count()} cores; median step after the 5th")
        base = None
        for jobs in (1, args.jobs):
            for policy in ("ACTIVE", "PASSIVE"):
                dirs = [tmp / f"{policy}-{jobs}-{i}" for i in range(jobs)]
                medians = median_steps(dirs, plan, policy)
                m = statistics.median(medians)
                base = base or m
                runs = ", ".join(f"{x * 1e3:.1f}" for x in medians)
                print(f"{jobs} run(s) at once, OMP_WAIT_POLICY={policy:7s}: median step {m * 1e3:7.1f} ms "
                      f"({runs}), {m / base:5.2f}x the lone ACTIVE run")


if __name__ == "__main__":
    main()
