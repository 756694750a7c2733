"""`make gpu-check`'s running (bench/gpu_check.py): each row trained with `ulab train` on the device, checked, and
written to the CSV as it finishes."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_check_report import SmiPeak, append_row, catalog_gpu, error_pct, format_row, has, rnd, smi_used_gib
from bench.gpu_check_rows import Row
from bench.gpu_models import CPU_GPU, write_long_documents
from plan.outcome import OUTCOME_FILE, Cause, Outcome, read_outcome
from worker.trainer.offload_summary import LINE
from worker.trainer.offload_summary import read_lines as read_offload_lines

ROOT = Path(__file__).resolve().parents[1]
# each step's figures kept in OUT/*.steps.jsonl (the trainer's metrics records; the phases are worker/trainer/phases.py)
STEP_FIELDS = ("step", "loss", "step_time_s", "forward_s", "backward_s", "optimizer_s", "metrics_overhead_s",
               "tokens_per_s", "mfu")


def row_status(code: int, outcome: Outcome | None) -> str:
    """A row's status: "timeout" (the check stopped it, 124), "ok", "oom" when the attempt's outcome record
    (plan/outcome.py) says so, else "exit N"."""
    if code == 124:
        return "timeout"
    if code == 0:
        return "ok"
    return "oom" if outcome is not None and outcome.cause == Cause.OOM else f"exit {code}"


class Check:
    def __init__(self, a: argparse.Namespace, cuda: bool):
        self.a, self.cuda = a, cuda
        self.t0 = a.t0 if a.t0 is not None else time.time()
        self.work = Path(tempfile.mkdtemp(prefix="ulab-gpu-check-"))
        self.flash = cuda and has("flash_attn")
        self.liger = cuda and has("liger_kernel")
        if cuda:
            import torch

            self.device_name = torch.cuda.get_device_name(0)
            self.gpu = catalog_gpu(self.device_name)
        else:
            self.device_name, self.gpu = "cpu-rehearsal", CPU_GPU
        slug = "".join(c if c.isalnum() else "-" for c in self.device_name).strip("-").lower()
        prefix = "gpu-" if cuda else ""
        self.csv = Path(a.out) / f"{prefix}{slug}-{datetime.date.today().isoformat()}.csv"
        self.data = write_long_documents(self.work / "short.txt", doc_len=3000 if cuda else 600,
                                         total=1_000_000 if cuda else 200_000)
        self.smi_idle = smi_used_gib()
        self.failures: list[str] = []

    @property
    def left_s(self) -> float:
        return self.a.budget_s - (time.time() - self.t0)

    @property
    def attn(self) -> str:
        return "flash_attention_2" if self.flash else "sdpa"

    @property
    def kernel(self) -> str:
        if not self.cuda:
            return "sdpa (CPU)"
        return "flash-attn varlen" if self.flash else "sdpa (flash-attn missing)"

    def plan(self, r: Row) -> dict:
        t = {"seq_len": r.seq_len, "micro_batch_size": 1, "grad_accum": r.gas, "dtype": "bf16" if self.cuda else
             "fp32", "zero_stage": 2, "activation_checkpointing": False, "attn_implementation": self.attn}
        t.update(r.training)
        data = self.one_document_rows(r.seq_len, r.steps * r.gas * (r.gpus // r.sp)) if r.one_document else self.data
        return {"model": {"config": dict(r.model)},
                "hardware": {"gpu": self.gpu, "gpus_per_node": r.gpus, "num_nodes": 1},
                "parallel": {"sp_size": r.sp, "dp_size": r.gpus // r.sp}, "training": t,
                "run": {"steps": r.steps, "learning_rate": 1e-4, "seed": 0, "data": {"path": str(data)},
                        "model_path": None, "checkpoint_every": 0, **r.run}}

    def one_document_rows(self, seq_len: int, rows: int) -> Path:
        """Documents of seq_len - 1 bytes: with EOS, each packed row is exactly one document. `rows` the run
        trains on, and a few more."""
        n = max(4, rows + 2)
        path = self.work / f"docs-{seq_len}-{n}.txt"
        return path if path.exists() else write_long_documents(path, doc_len=seq_len - 1, total=n * seq_len)

    def train(self, name: str, plan: dict, *, resume: bool = False, attempt: int = 1, share_device: bool = False,
              env: dict[str, str] | None = None):
        """(exit code, metrics rows of this attempt, log, nvidia-smi peak GiB less idle, wall seconds)."""
        run_dir = self.work / name
        plan_path = self.work / f"{name}.json"
        plan_path.write_text(json.dumps(plan))
        cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir)]
        if resume:
            cmd += ["--resume", "--attempt", str(attempt)]
        smi = SmiPeak()
        smi.start()
        t = time.monotonic()
        try:
            code, out = self.command(name, cmd, {"ULAB_TRAINER_SKIP_FINAL_SAVE": "1",
                                                 "ULAB_TRAINER_SHARE_DEVICE": "1" if share_device else "0",
                                                 **(env or {})})
        finally:
            smi.done.set()
            smi.join()
        path = run_dir / ("metrics.jsonl" if attempt == 1 else f"metrics.attempt-{attempt}.jsonl")
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        peak = None if smi.peak_gib is None or self.smi_idle is None else smi.peak_gib - self.smi_idle
        return code, rows, out, peak, time.monotonic() - t

    def command(self, name: str, cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
        """Run `cmd` (this checkout on PYTHONPATH, `env` added) within the row's timeout and the budget left:
        (exit code, 124 on timeout; its output). A failure's last 40 lines go to the check's log: the run directory
        is deleted once the row is written."""
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                                  timeout=max(10.0, min(self.a.run_timeout_s, self.left_s)))
            code, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            code, out = 124, f"timed out after {e.timeout:.0f} s"
        if code != 0:
            tail = "\n".join(f"  | {line}" for line in out.strip().splitlines()[-40:])
            print(f"{name}: exit {code}; the last lines of its output:\n{tail}", flush=True)
        return code, out

    def expect(self, label: str, code: int, rows: list[dict], out: str, steps: list[int]) -> list[str]:
        last = out.strip().splitlines()[-1] if out.strip() else ""
        if code != 0:
            return [f"{label}: exit {code}: {last}"]
        problems = []
        if [r["step"] for r in rows] != steps:
            problems.append(f"{label}: steps {[r['step'] for r in rows]}, expected {steps}")
        measure = "cuda_allocator" if self.cuda else "cpu_tensor_tracker"
        if rows and ((self.cuda and rows[-1].get("mfu") is None) or rows[-1].get("memory_measure") != measure
                     or not all(v and v > 0 for v in rows[-1].get("peak_allocated_gib") or [None])):
            problems.append(f"{label}: mfu or peak memory ({measure}) missing: {rows[-1]}")
        return problems

    def write(self, r: Row, status: str, plan: dict, rows: list[dict], smi: float | None, wall: float | None,
              note: str = "", extra: dict | None = None) -> None:
        e = r.estimate if r.estimate and r.estimate["valid"] else None
        out: dict = {"part": r.part, "name": r.name, "status": status, "model": r.model_name, "seq_len": r.seq_len,
                     "features": r.features, "kernel": self.kernel, "predicted_fits": r.fits,
                     "nvidia_smi_idle_gib": rnd(self.smi_idle), "wall_s": rnd(wall), "note": note,
                     "plan": json.dumps({k: v for k, v in plan.items() if k != "run"})}
        if e:
            m, t = e["memory"], e["throughput"]
            out.update(predicted_allocated_gib=m["peak_allocated_gib"], predicted_reserved_gib=m["reserved_gib"],
                       predicted_device_gib=m["device_total_gib"], predicted_step_time_s=t["step_time_s"],
                       predicted_tokens_per_s=t["tokens_per_s"], predicted_mfu=t["mfu"])
        if rows:
            out["measured_allocated_gib"] = max(max(v for v in x["peak_allocated_gib"] if v) for x in rows)
            if rows[-1].get("peak_reserved_gib"):
                out["measured_reserved_gib"] = max(max(v for v in x["peak_reserved_gib"] if v) for x in rows)
            later = rows[1:] or rows  # the first step carries warm-up (kernels, allocator growth)
            out["step_time_s"] = rnd(sorted(x["step_time_s"] for x in later)[len(later) // 2])
            out["tokens_per_s"] = rnd(sorted(x["tokens_per_s"] or 0 for x in later)[len(later) // 2])
            out["mfu"] = rnd(rows[-1].get("mfu"))
            for k in ("forward_s", "backward_s", "optimizer_s", "metrics_overhead_s"):
                values = sorted(x[k] for x in later if x.get(k) is not None)
                out[k] = rnd(values[len(values) // 2]) if values else None
        out["nvidia_smi_gib"] = None if r.gpus > 1 else rnd(smi)  # ranks sharing one GPU: not one rank's figure
        for a, p, m in (("allocated", "predicted_allocated_gib", "measured_allocated_gib"),
                        ("reserved", "predicted_reserved_gib", "measured_reserved_gib"),
                        ("device", "predicted_device_gib", "nvidia_smi_gib")):
            out[f"{a}_error_pct"] = error_pct(out.get(p), out.get(m))
        out.update(extra or {})
        append_row(self.csv, out)
        if rows:  # every step's figures beside the CSV's medians: OUT/<csv name>.steps.jsonl, one line per row
            with self.csv.with_suffix(".steps.jsonl").open("a") as f:
                f.write(json.dumps({"name": r.name, "status": status, "env": r.env, "steps": [
                    {k: x.get(k) for k in STEP_FIELDS} for x in rows]}) + "\n")
        print(format_row(out), flush=True)

    def run_row(self, r: Row) -> None:
        plan = self.plan(r)
        if self.left_s < self.a.min_row_s:
            self.write(r, "skipped (time budget)", plan, [], None, None)
            return
        code, rows, out, smi, wall = self.train(r.name, plan, share_device=r.gpus > 1, env=r.env)
        status = row_status(code, read_outcome(self.work / r.name, [self.work / r.name / OUTCOME_FILE]))
        problems = [] if status in ("oom", "timeout") and r.part == "sweep" else self.expect(
            r.name, code, rows, out, list(range(1, r.steps + 1)))
        note = ""
        if r.training.get("checkpoint_offload") and code == 0:  # alst and alst+liger rows, suite and sweep
            lines = read_offload_lines(out)
            note = LINE.search(out).group(0) if lines else "no checkpoint-offload line"
            if not lines:  # the trainer's line (worker/trainer/offload_summary.py), on CPU ranks too
                problems.append(f"{r.name}: the trainer printed no checkpoint-offload line")
            elif self.cuda and not lines[-1]["offloaded"] > 0:  # CPU ranks keep them in place
                problems.append(f"{r.name}: activation-checkpoint offload moved nothing to the host ({note})")
            if r.training.get("offload_optimizer") and "optimizer: DeepSpeedCPUAdam" not in out:
                problems.append(f"{r.name}: the offloaded optimizer is not DeepSpeedCPUAdam")
        if r.training.get("liger_kernel") and code == 0:  # the loss the planner counted is the loss that ran
            from plan import validate

            fused = validate(plan).spec.liger_fused_loss
            said = next((x for x in out.splitlines() if x.startswith("loss: ")), "no loss line")
            if fused != said.startswith("loss: Liger fused linear cross-entropy"):
                problems.append(f"{r.name}: the plan says Liger's fused loss {'runs' if fused else 'does not run'}; "
                                f"the trainer said {said!r}")
        if r.part == "ulysses" and code == 0:
            agree = self.compare_ulysses(r, rows)
            problems += agree[1:]
            note = agree[0]
        if problems and status == "ok":
            status = "failed"
        if code not in (0, 3):
            note = (note + " " + (out.strip().splitlines() or [""])[-1][-300:]).strip()
        self.failures += problems
        self.write(r, status, plan, rows, smi, wall, note)
        shutil.rmtree(self.work / r.name, ignore_errors=True)

    def compare_ulysses(self, r: Row, two: list[dict]) -> list[str]:
        """SP=2 (both ranks on this device) against one rank with the same grad_accum: the same rows per step
        (micro_batch x grad_accum x dp, and dp is 1 in both)."""
        one_row = Row("ulysses", r.name + "-one", r.model_name, r.model, r.seq_len, r.features, r.training,
                      steps=r.steps, gas=r.gas)
        code, one, out, _, _ = self.train(one_row.name, self.plan(one_row))
        shutil.rmtree(self.work / one_row.name, ignore_errors=True)
        problems = self.expect(one_row.name, code, one, out, list(range(1, r.steps + 1)))
        tol = 1e-4 if r.training.get("dtype", "fp32" if not self.cuda else "bf16") == "fp32" else 2e-2
        worst = max((abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, two)), default=None)
        ok = worst is not None and len(one) == len(two) == r.steps and worst <= tol
        note = (f"SP=2 vs one rank, {min(len(one), len(two))} steps, worst relative loss difference {worst} "
                f"(tolerance {tol})")
        print(f"{r.name}: {note}: {'ok' if ok else 'FAILED'}", flush=True)
        if not ok:
            problems.append(f"{r.name}: SP=2 losses {[x['loss'] for x in two]} vs one rank "
                            f"{[x['loss'] for x in one]}")
        return [note, *problems]

    def overhead(self, r: Row) -> None:
        """The trainer's run, then bench/bare_loop.py on its run directory (the same packed rows, model, DeepSpeed
        config, optimizer, schedule and loss; no Trainer, no callbacks, no metrics): the median step of each after
        the first, side by side. The first H100 window measured the trainer's steps at 1.3x to 21x the planner's
        prediction; this says how much of that is the trainer's own."""
        plan = self.plan(r)
        if self.left_s < 2 * self.a.min_row_s:
            self.write(r, "skipped (time budget)", plan, [], None, None)
            return
        code, rows, out, smi, wall = self.train(r.name, plan)
        problems = self.expect(r.name, code, rows, out, list(range(1, r.steps + 1)))
        bare, note = None, ""
        run_dir = self.work / r.name
        if code == 0:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                   str(ROOT / "bench" / "bare_loop.py"), "--plan", str(self.work / f"{r.name}.json"),
                   "--run-dir", str(run_dir)]
            bare_code, _ = self.command(f"{r.name} (bare loop)", cmd, {})
            if bare_code == 0 and (run_dir / "bare.json").exists():
                bare = json.loads((run_dir / "bare.json").read_text())
            else:
                problems.append(f"{r.name}: bare loop exit {bare_code}")
        extra: dict = {}
        if bare and rows:
            times = sorted(bare["step_times"][1:] or bare["step_times"])
            b = times[len(times) // 2]
            later = rows[1:] or rows
            t = sorted(x["step_time_s"] for x in later)[len(later) // 2]
            worst = max((abs(x["loss"] - y) / abs(x["loss"]) for x, y in zip(rows, bare["losses"])), default=None)
            parts = "/".join(f"{statistics.median(x[k] for x in later if x.get(k) is not None):.4g}"
                             if any(x.get(k) is not None for x in later) else "-"
                             for k in ("forward_s", "backward_s", "optimizer_s", "metrics_overhead_s"))
            note = (f"trainer {t:.4g} s/step, bare loop {b:.4g} s/step ({t / b:.2f}x); the trainer's forward/"
                    f"backward/optimizer/callback {parts} s; losses within {worst:.2g} relative")
            extra["bare_step_time_s"] = rnd(b)
            print(f"{r.name}: {note}", flush=True)
        self.failures += problems
        status = "ok" if code == 0 and not problems else ("failed" if code == 0 else f"exit {code}")
        self.write(r, status, plan, rows, smi, wall, note, extra)
        shutil.rmtree(run_dir, ignore_errors=True)

    def resume(self, r: Row) -> None:
        """Checkpoint after step k, run on to the last step; attempt 2 resumes from k and writes
        metrics.attempt-2.jsonl, whose steps must repeat attempt 1's (CPU fp32: 1e-4 relative; bf16: 2%)."""
        plan = self.plan(r)
        if self.left_s < 2 * self.a.min_row_s:
            self.write(r, "skipped (time budget)", plan, [], None, None)
            return
        k, steps = r.run["checkpoint_every"], list(range(1, r.steps + 1))
        code, first, out, smi, wall = self.train(r.name, plan)
        problems = self.expect(f"{r.name} (attempt 1)", code, first, out, steps)
        code2, again, out2, _, wall2 = self.train(r.name, plan, resume=True, attempt=2)
        problems += self.expect(f"{r.name} (attempt 2)", code2, again, out2, steps[k:])
        tol = 2e-2 if self.cuda else 1e-4
        for a, b in zip(first[k:], again):
            if abs(a["loss"] - b["loss"]) > tol * abs(a["loss"]):
                problems.append(f"{r.name}: step {a['step']} loss {b['loss']} after resume vs {a['loss']}")
        note = (f"attempt 2 (metrics.attempt-2.jsonl) steps {[x['step'] for x in again]} losses "
                f"{[round(x['loss'], 6) for x in again]} vs attempt 1 {[round(x['loss'], 6) for x in first[k:]]}")
        print(f"{r.name}: {note}: {'ok' if not problems else 'FAILED'}", flush=True)
        self.failures += problems
        self.write(r, "ok" if not problems else "failed", plan, first, smi, wall + wall2, note)
        shutil.rmtree(self.work / r.name, ignore_errors=True)


def build_ops() -> None:
    """DeepSpeedCPUAdam's JIT build (g++, ninja; ~1 min), once, before any row and outside every row's timeout: a
    row killed mid-build would leave torch's build lock behind, and every later build would wait on it forever."""
    t = time.monotonic()
    build = "from worker.trainer.launcher import build_cpu_adam; build_cpu_adam()"
    proc = subprocess.run([sys.executable, "-c", build],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    print(f"DeepSpeedCPUAdam build: {'ok' if proc.returncode == 0 else 'FAILED: ' + last[0]} "
          f"({time.monotonic() - t:.0f} s)", flush=True)
