"""`make gpu-check`'s probe part (bench/gpu_check.py --parts probe): `ulab probe` of a row's model on this device.

The probe (worker/probe.py) trains the model at 1, 2 and 4 layers, every depth in one launch, and extrapolates
each figure to the model's depth. Where the planner predicts the full depth fits this device, `--full` adds the
full-depth run to the same launch, and the row compares the extrapolation with it. One CSV row per probe:
  - measured_* / step_time_s / tokens_per_s: the full-depth run's own metrics (empty without it);
  - extrapolated_allocated_gib / extrapolated_step_time_s: the depth line at the model's depth;
  - extrapolation_*_error_pct: the extrapolation against the full-depth run (worst rank for memory);
  - status "ok" with the full run, "extrapolated" without it (calibration loads only "ok" rows: an extrapolation
    is no measurement), "oom" / "failed" / "timeout" otherwise; the note carries the probe's verdict line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bench.gpu_check_report import SmiPeak, rnd
from bench.gpu_check_rows import PROBE_DEPTHS, Row

if TYPE_CHECKING:
    from bench.gpu_check_run import Check

ROOT = Path(__file__).resolve().parents[1]
CPU_FULL_LAYERS = 8


def probe_status(result: dict | None, code: int, full: bool) -> str:
    if code == 124:
        return "timeout"
    if result is None:
        return f"exit {code}"
    statuses = [m["status"] for m in result["measured"]]
    if "oom" in statuses:
        return "oom"
    if any(s != "ok" for s in statuses) or code != 0:
        return "failed"
    return "ok" if full else "extrapolated"


def worst(errors: list | None) -> float | None:
    vals = [e for e in errors or [] if e is not None]
    return max(vals, key=abs) if vals else None


def comparison(result: dict) -> dict:
    """The CSV's extrapolation columns from probe.json."""
    e, check = result["extrapolated"], result.get("check") or {}
    fits = result.get("fits") or {}
    depth = result["plan_depth"]

    def line_at(q: str) -> float | None:  # the line's own value at full depth (extrapolated holds the measurement
        f = fits.get(q)                      # there when the full depth ran)
        return None if not f or f.get("slope") is None else f["intercept"] + f["slope"] * depth

    alloc_err = worst((check.get("peak_allocated_gib") or {}).get("error"))
    step_err = (check.get("step_time_s") or {}).get("error")
    return {"extrapolated_allocated_gib": rnd(line_at("peak_allocated_gib") or e.get("peak_allocated_gib")),
            "extrapolated_step_time_s": rnd(line_at("step_time_s") or e.get("step_time_s")),
            "extrapolation_allocated_error_pct": None if alloc_err is None else round(100 * alloc_err, 1),
            "extrapolation_step_time_error_pct": None if step_err is None else round(100 * step_err, 1)}


def run_probe_row(ck: Check, r: Row) -> None:
    plan = ck.plan(r)
    if ck.left_s < ck.a.min_row_s:
        ck.write(r, "skipped (time budget)", plan, [], None, None)
        return
    # GPU: the full depth where the planner predicts it fits. CPU (the rehearsal): its small custom device fits
    # nothing by the planner's fixed overheads, so the 8-layer row runs its full depth to rehearse the comparison
    full = r.fits is True if ck.cuda else r.model["num_hidden_layers"] <= CPU_FULL_LAYERS
    work = ck.work / r.name
    work.mkdir(parents=True, exist_ok=True)
    plan_path = work / "plan.json"
    plan_path.write_text(json.dumps(plan))
    out = work / "probe"
    cmd = [sys.executable, "-m", "worker.probe", "--plan", str(plan_path), "--out", str(out),
           "--depths", ",".join(map(str, PROBE_DEPTHS)), "--steps", str(r.steps)] + (["--full"] if full else [])
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    smi = SmiPeak()
    smi.start()
    t = time.monotonic()
    try:  # every depth in one launch: the row's timeout is a run's for each depth
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=max(
            10.0, min(ck.a.run_timeout_s * (len(PROBE_DEPTHS) + full), ck.left_s)))
        code, log = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, log = 124, f"timed out after {e.timeout:.0f} s"
    finally:
        smi.done.set()
        smi.join()
    wall = time.monotonic() - t
    try:
        result: dict | None = json.loads((out / "probe.json").read_text())
    except (OSError, ValueError):
        result = None
    status = probe_status(result, code, full)
    rows: list[dict] = []
    extra: dict = {}
    note = (log.strip().splitlines() or [""])[-1][-300:]
    if result is not None:
        extra = comparison(result)
        depth = result["plan_depth"]
        metrics = out / f"depth-{depth}" / "metrics.jsonl"
        if full and metrics.exists():  # the full-depth run's own records: measured_* as any row's
            rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        note = f"{result['verdict']['text']}; depths {result['depths']} in {result.get('wall_s')} s"
        against = (f"against the full run: allocated {extra['extrapolation_allocated_error_pct']}%, step "
                   f"{extra['extrapolation_step_time_error_pct']}%" if full else "no full-depth run")
        print(f"{r.name}: extrapolated to {depth} layers: allocated {extra['extrapolated_allocated_gib']} GiB, "
              f"step {extra['extrapolated_step_time_s']} s; {against}", flush=True)
    if status in ("failed", f"exit {code}"):
        ck.failures.append(f"{r.name}: probe {status}: {note}")
    peak = None if smi.peak_gib is None or ck.smi_idle is None else smi.peak_gib - ck.smi_idle
    ck.write(r, status, plan, rows, peak if full else None, wall, note, extra)
    shutil.rmtree(work, ignore_errors=True)
