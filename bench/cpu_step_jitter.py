"""How far tokens/s of a healthy CPU run falls below its own median by jitter alone: the figure the throughput-drop
rule's CPU floor (backend/alerts/service.py CPU_JITTER_FLOOR) stays below.

Runs `ulab train` on the tiny Llama of tests/tiny.py (2 CPU ranks, SP=2, the corpus the tests train on) for
`--steps` steps, `--runs` times, nothing else changed, and reads tokens_per_s of every step. For each step from the
rule's first comparable one on, it computes the statistic the rule compares with its floor: the highest tokens/s of
the last SUSTAIN steps over the median of the HISTORY steps before them (the rule fires when it is below the floor).
Prints, per run, the median tokens/s, the lowest one-step ratio to the rolling median, and the lowest windowed
statistic; the floor must stay below the lowest of these over every run. The machine is whatever runs it (a shared
one jitters more): the figures say so only for where they were measured.
Usage: .venv/bin/python bench/cpu_step_jitter.py [--steps 300] [--runs 2]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.alerts.service import HISTORY, MIN_HISTORY, SUSTAIN  # noqa: E402
from tests.tiny import write_run_plan  # noqa: E402

ULAB = Path(sys.executable).parent / "ulab"


def windowed_lows(tps: list[float]) -> tuple[float, float]:
    """(lowest step / median of the HISTORY steps before it, lowest max-of-SUSTAIN-steps / median before them), over
    the steps the rule compares (MIN_HISTORY steps of history at least)."""
    one, window = [], []
    for i in range(MIN_HISTORY, len(tps)):
        one.append(tps[i] / statistics.median(tps[max(0, i - HISTORY):i]))
    for i in range(MIN_HISTORY + SUSTAIN - 1, len(tps)):
        last, before = tps[i - SUSTAIN + 1:i + 1], tps[max(0, i - SUSTAIN - HISTORY + 1):i - SUSTAIN + 1]
        if len(before) >= MIN_HISTORY:
            window.append(max(last) / statistics.median(before))
    return min(one), min(window)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        write_run_plan(tmp, args.steps)
        lows = []
        print(f"tiny Llama, 2 CPU ranks, {args.steps} steps; rule: SUSTAIN {SUSTAIN}, HISTORY {HISTORY}, "
              f"MIN_HISTORY {MIN_HISTORY}")
        for n in range(args.runs):
            run_dir = tmp / f"run{n}"
            proc = subprocess.run([str(ULAB), "train", "--plan", str(tmp / "plan.json"), "--run-dir", str(run_dir)],
                                  capture_output=True, text=True, timeout=3600)
            if proc.returncode:
                raise SystemExit(f"run {n} failed: {proc.stderr.strip().splitlines()[-1]}")
            rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
            tps = [r["tokens_per_s"] for r in sorted(rows, key=lambda r: r["step"]) if r.get("tokens_per_s")]
            one, window = windowed_lows(tps)
            lows.append(window)
            print(f"run {n}: median {statistics.median(tps):,.0f} tokens/s; lowest step / rolling median {one:.3f}; "
                  f"lowest max-of-{SUSTAIN} / median before (the rule's statistic) {window:.3f}")
        print(f"lowest of the rule's statistic over {args.runs} runs: {min(lows):.3f}")


if __name__ == "__main__":
    main()
