"""`ulab probe`: train the plan at reduced depths on this machine and extrapolate to the model's depth.

Each depth is a real `ulab train` of the probe plan (plan/probe.py: random weights, the plan's layout, a few
steps) in OUT/depth-N, under torchrun as any run. Its metrics file gives, per rank, the peak allocated and reserved
memory (CPU ranks: the trainer's live-tensor count) and the nvidia-smi total, and per step the step time,
tokens/s and loss; the first step is dropped. An out-of-memory exit is a result ("does not fit even at 2
layers"): the deeper probes are then skipped. OUT/probe.json holds the result (plan.probe.summarize).
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from plan.probe import DEPTHS, STEPS, ProbeError, full_depth, probe_plan, summarize, text_table
from worker.trainer.exits import EXIT_OOM, says_out_of_memory

RESULT = "probe.json"
REQUEST = "probe_request.json"  # beside a Slurm job's plan.json: the job runs a probe (worker/slurm_job.py)
# the same filler on every rank and depth: the byte tokenizer turns it into ids below 256 (any vocab holds them)
WORDS = "ulysses splits the sequence across ranks and trades tokens for attention heads in one all to all".split()


def write_data(path: Path, seq_len: int) -> Path:
    """Documents enough for two packed rows (the trainer's rows cycle, so a probe needs no more)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    need, i = 2 * seq_len + 2, 0
    docs: list[str] = []
    while sum(len(d) + 2 for d in docs) < need:
        docs.append(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) + ".")
        i += 1
    path.write_text("\n\n".join(docs) + "\n")
    return path


def read_depth(run_dir: Path, world: int) -> dict:
    """Per rank peaks and the step figures of one depth's metrics, the first step dropped."""
    from worker.trainer.attempt import read_metrics

    records = [r for r in read_metrics(run_dir) if "peak_allocated_gib" in r]
    kept = records[1:] or records
    ranks = []
    for r in range(world):
        def peak(name: str, r=r) -> float | None:
            vals = [rec[name][r] for rec in kept if isinstance(rec.get(name), list) and r < len(rec[name])
                    and rec[name][r] is not None]
            return max(vals) if vals else None

        ranks.append({"rank": r, "peak_allocated_gib": peak("peak_allocated_gib"),
                      "reserved_gib": peak("peak_reserved_gib"), "device_total_gib": peak("gpu_mem_used_gib")})
    step_times = [rec["step_time_s"] for rec in kept if rec.get("step_time_s")]
    tps = [rec["tokens_per_s"] for rec in kept if rec.get("tokens_per_s")]
    losses = [rec.get("loss") for rec in records]
    return {"ranks": ranks, "steps": len(records), "steps_kept": len(kept),
            "step_time_s": statistics.median(step_times) if step_times else None,
            "tokens_per_s": statistics.median(tps) if tps else None,
            "loss_finite": bool(losses) and all(x is not None and math.isfinite(x) for x in losses),
            "breakdown_s": None}  # the trainer does not time forward, backward and optimizer step apart


def run_depth(plan: dict, run_dir: Path, timeout_s: float | None) -> tuple[int, str]:
    """`ulab train` of one probe plan: (exit code, its last stderr line)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_path = run_dir / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir)]
    with open(run_dir / "train.log", "w") as log:
        try:
            code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            return 124, f"no result within {timeout_s:.0f} s"
    lines = [s for s in (run_dir / "train.log").read_text(errors="replace").splitlines() if s.strip()]
    err = run_dir / "error.txt"
    reason = err.read_text().strip().splitlines()[-1] if err.exists() and err.read_text().strip() else (
        lines[-1] if lines and code else "")
    return code, reason


def probe(data: dict, out: Path, depths: tuple[int, ...] = DEPTHS, steps: int = STEPS, full: bool = False,
          timeout_s: float | None = None) -> dict:
    """Run the probe of plan `data` into `out`; returns (and writes to out/probe.json) the result."""
    import torch

    from plan import validate

    cuda = torch.cuda.is_available()
    v = validate(data)
    if v.spec is None:
        first = v.errors[0] if v.errors else {"field": "plan", "message": "not valid"}
        raise ProbeError(f"{first['field']}: {first['message']}")
    spec = v.spec
    wanted = sorted({d for d in depths if 1 <= d <= full_depth(spec)} | ({full_depth(spec)} if full else set()))
    if not wanted:
        raise ProbeError(f"--depths: none of {list(depths)} is between 1 and the model's {full_depth(spec)} layers")
    out.mkdir(parents=True, exist_ok=True)
    corpus = write_data(out / "data.txt", spec.plan.training.seq_len)
    measured: list[dict] = []
    for d in wanted:
        if any(m["status"] == "oom" for m in measured):
            measured.append({"depth": d, "status": "skipped", "reason": "a smaller depth ran out of memory"})
            continue
        run_dir = out / f"depth-{d}"
        plan = probe_plan(data, d, steps, str(corpus), cuda)
        code, reason = run_depth(plan, run_dir, timeout_s)
        entry = {"depth": d, **read_depth(run_dir, spec.world)}
        shutil.rmtree(run_dir / "stages", ignore_errors=True)  # the trainer saved its random-weight model: no use
        if code == 0:
            entry["status"], entry["reason"] = "ok", None
        else:
            entry["status"] = "oom" if code == EXIT_OOM or says_out_of_memory(reason) else "failed"
            entry["reason"] = reason or f"exit code {code}"
        measured.append(entry)
        print(f"probe: depth {d}: {entry['status']}" + (f" ({entry['reason']})" if entry["reason"] else ""),
              file=sys.stderr, flush=True)
    result = summarize(data, measured, "cuda" if cuda else "cpu")
    (out / RESULT).write_text(json.dumps(result, indent=1))
    return result


def probe_command(plan_path: Path, out: Path, request: dict | None) -> list[str]:
    """The worker's command for a run of kind "probe" (`request`: {"depths", "steps"} of POST .../probe)."""
    request = request or {}
    return [sys.executable, "-m", "worker.probe", "--plan", str(plan_path), "--out", str(out),
            "--depths", ",".join(str(d) for d in request.get("depths") or DEPTHS),
            "--steps", str(request.get("steps") or STEPS)]


def run_probe_cli(plan_path: Path, out: Path, depths: tuple[int, ...], steps: int, full: bool, text: bool) -> int:
    from worker.trainer.spec import PlanError, load_plan

    try:
        data = load_plan(plan_path)
        result = probe(data, out, depths, steps, full)
    except (PlanError, ProbeError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(text_table(result) if text else json.dumps(result, indent=1), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m worker.probe` (the worker's command for a run of kind "probe")."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m worker.probe")
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--depths", default=",".join(map(str, DEPTHS)))
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--full", action="store_true")
    p.add_argument("--text", action="store_true")
    a = p.parse_args(argv)
    return run_probe_cli(a.plan, a.out, parse_depths(a.depths), a.steps, a.full, a.text)


def parse_depths(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SystemExit(f"--depths: {text!r} is not a comma-separated list of layer counts") from None


if __name__ == "__main__":
    raise SystemExit(main())
