"""`make gpu-check`: the trainer on a real GPU, and the planner's prediction beside what the run measured.

Not part of `make test`. Exits 2 when torch cannot be imported; 2 with `--require-cuda` and no CUDA device; without
CUDA and without `--cpu` it prints "no CUDA device: GPU check skipped" and exits 0. docs/gpu-check.md has the
commands for a GPU machine lent for 30 minutes, `make gpu-rehearsal` runs all of this on CPU ranks (`--cpu`).

Parts (`--parts`, default all; `--only REGEX` / `--skip REGEX` filter rows by name; `--list` prints the rows):
  suite    one device: ZeRO-2, ZeRO-3, every ALST feature (ZeRO-3 + optimizer and parameter offload with
           DeepSpeedCPUAdam, activation checkpointing with offload, TiledMLP, tiled loss), flash_attention_2 and
           Liger where installed, and a checkpoint-resume whose second attempt's metrics (metrics.attempt-2.jsonl)
           must repeat the first attempt's steps 4-5.
  ulysses  SP=2 against one rank with grad_accum 2 (the same rows per step), step by step. With one GPU both ranks
           share it over gloo (ULAB_TRAINER_SHARE_DEVICE): the Ulysses all-to-all, the sharded loss and ZeRO on
           CUDA tensors run; NCCL, NVLink bandwidth and two devices' memory stay unproven (docs/gpu-check.md).
  sweep    seq_len for a ~1B Llama and Llama-3.1-8B's layer shape (4 of 32 layers), with and without the
           memory features: the planner's prediction beside the measurement.

Every row, as it finishes, is appended to OUT/gpu-<gpu>-<date>.csv (`--out`, default bench/results; on CPU
OUT/cpu-rehearsal-<date>.csv, which calibration never reads): predicted and measured peak allocated, reserved,
device total (nvidia-smi's used memory less its idle reading before the first row), step time, tokens/s, MFU.
Rows predicted not to fit run last; the final model is not saved (ULAB_TRAINER_SKIP_FINAL_SAVE); each run
directory is deleted once its metrics are read. Time budget `--budget-s` from `--t0` (scripts/gpu_wheels.sh
passes the install's start, so the install counts): a row that no longer fits in it is written as skipped.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_models import (  # noqa: E402
    CPU_GPU,
    CPU_MODEL,
    LLAMA_1B,
    LLAMA_8B_4_LAYERS,
    SUITE_MODEL,
    write_long_documents,
)

PARTS = ("suite", "ulysses", "sweep")
ALST = {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "activation_checkpointing": True,
        "checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True}
SWEEP_FEATURES = {
    "plain": {"zero_stage": 3, "activation_checkpointing": True},
    "tiled": {"zero_stage": 3, "activation_checkpointing": True, "tiled_mlp": True, "tiled_logits_loss": True},
    "alst": ALST,
}
# the columns of OUT/gpu-*.csv; backend/calibration/service.py load_results reads `status`, `plan` and the
# measured ones, and loads only rows whose status is "ok"
FIELDS = ["part", "name", "status", "model", "seq_len", "features", "kernel", "predicted_fits",
          "predicted_allocated_gib", "measured_allocated_gib", "allocated_error_pct",
          "predicted_reserved_gib", "measured_reserved_gib", "reserved_error_pct",
          "predicted_device_gib", "nvidia_smi_gib", "device_error_pct", "nvidia_smi_idle_gib",
          "predicted_step_time_s", "step_time_s", "predicted_tokens_per_s", "tokens_per_s", "predicted_mfu", "mfu",
          "wall_s", "note", "plan"]


@dataclass
class Row:
    part: str
    name: str
    model_name: str
    model: dict
    seq_len: int
    features: str
    training: dict
    steps: int = 3
    gpus: int = 1
    sp: int = 1
    gas: int = 1
    one_document: bool = False
    run: dict = field(default_factory=dict)
    estimate: dict | None = None

    @property
    def fits(self) -> bool | None:
        e = self.estimate
        return e["memory"]["fits"] if e and e["valid"] else None


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
        data = self.one_document_rows(r.seq_len) if r.one_document else self.data
        return {"model": {"config": dict(r.model)},
                "hardware": {"gpu": self.gpu, "gpus_per_node": r.gpus, "num_nodes": 1},
                "parallel": {"sp_size": r.sp, "dp_size": r.gpus // r.sp}, "training": t,
                "run": {"steps": r.steps, "learning_rate": 1e-4, "seed": 0, "data": {"path": str(data)},
                        "model_path": None, "checkpoint_every": 0, **r.run}}

    def one_document_rows(self, seq_len: int) -> Path:
        """Documents of seq_len - 1 bytes: with EOS, each packed row is exactly one document."""
        path = self.work / f"docs-{seq_len}.txt"
        return path if path.exists() else write_long_documents(path, doc_len=seq_len - 1, total=4 * seq_len)

    def train(self, name: str, plan: dict, *, resume: bool = False, attempt: int = 1, share_device: bool = False):
        """(exit code, metrics rows of this attempt, log, nvidia-smi peak GiB less idle, wall seconds)."""
        run_dir = self.work / name
        plan_path = self.work / f"{name}.json"
        plan_path.write_text(json.dumps(plan))
        cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir)]
        if resume:
            cmd += ["--resume", "--attempt", str(attempt)]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "ULAB_TRAINER_SKIP_FINAL_SAVE": "1", "ULAB_TRAINER_SHARE_DEVICE": "1" if share_device else "0"}
        smi = SmiPeak()
        smi.start()
        t = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT,
                                  timeout=max(10.0, min(self.a.run_timeout_s, self.left_s)))
            code, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            code, out = 124, f"timed out after {e.timeout:.0f} s"
        finally:
            smi.done.set()
            smi.join()
        path = run_dir / ("metrics.jsonl" if attempt == 1 else f"metrics.attempt-{attempt}.jsonl")
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        peak = None if smi.peak_gib is None or self.smi_idle is None else smi.peak_gib - self.smi_idle
        return code, rows, out, peak, time.monotonic() - t

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
              note: str = "") -> None:
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
        out["nvidia_smi_gib"] = None if r.gpus > 1 else rnd(smi)  # ranks sharing one GPU: not one rank's figure
        for a, p, m in (("allocated", "predicted_allocated_gib", "measured_allocated_gib"),
                        ("reserved", "predicted_reserved_gib", "measured_reserved_gib"),
                        ("device", "predicted_device_gib", "nvidia_smi_gib")):
            out[f"{a}_error_pct"] = error_pct(out.get(p), out.get(m))
        append_row(self.csv, out)
        print(format_row(out), flush=True)

    def run_row(self, r: Row) -> None:
        plan = self.plan(r)
        if self.left_s < self.a.min_row_s:
            self.write(r, "skipped (time budget)", plan, [], None, None)
            return
        code, rows, out, smi, wall = self.train(r.name, plan, share_device=r.gpus > 1)
        status = {0: "ok", 3: "oom", 124: "timeout"}.get(code, f"exit {code}")
        problems = [] if code in (3, 124) and r.part == "sweep" else self.expect(
            r.name, code, rows, out, list(range(1, r.steps + 1)))
        note = ""
        if r.features == "alst" and code == 0:
            offloaded = re.search(r"checkpoint offload, last micro batch: (\d+) hidden states offloaded", out)
            note = offloaded.group(0) if offloaded else "no checkpoint-offload line"
            if self.cuda and not (offloaded and int(offloaded.group(1)) > 0):
                problems.append(f"{r.name}: activation-checkpoint offload moved nothing to the host")
            if "optimizer: DeepSpeedCPUAdam" not in out:
                problems.append(f"{r.name}: the offloaded optimizer is not DeepSpeedCPUAdam")
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


def rows_for(ck: Check) -> list[Row]:
    """Every row of every part, in the order they run: rows predicted not to fit last."""
    cuda = ck.cuda
    model, seq, steps = (SUITE_MODEL, 8192, 4) if cuda else (CPU_MODEL, 256, 2)
    name = "suite-150m" if cuda else "tiny"
    out = [Row("suite", "suite-zero2", name, model, seq, "zero2", {}, steps),
           Row("suite", "suite-zero3", name, model, seq, "zero3", {"zero_stage": 3}, steps),
           Row("suite", "suite-alst", name, model, seq, "alst", ALST, steps)]
    if ck.flash:
        out.append(Row("suite", "suite-flash", name, model, seq, "zero3+flash",
                       {"attn_implementation": "flash_attention_2", "zero_stage": 3}, steps))
    if ck.liger:
        out += [Row("suite", "suite-liger", name, model, seq, "liger", {"liger_kernel": True}, steps),
                Row("suite", "suite-liger-alst", name, model, seq, "alst+liger", {**ALST, "liger_kernel": True}, steps)]
    out.append(Row("suite", "suite-resume", name, model, seq, "zero3 resume", {"zero_stage": 3}, 5 if cuda else 3,
                   run={"checkpoint_every": 3 if cuda else 2}))
    exact = {"dtype": "fp32", "attn_implementation": "sdpa"}
    out.append(Row("ulysses", "ulysses-sp2", name, model, seq, "sp2 zero2", exact, steps, gpus=2, sp=2, gas=2))
    if cuda:
        out.append(Row("ulysses", "ulysses-sp2-zero3", name, model, seq, "sp2 zero3", {**exact, "zero_stage": 3},
                       3, gpus=2, sp=2, gas=2))
    if cuda:
        cases = [(m, cfg, f, s) for m, cfg in (("llama-1b", LLAMA_1B), ("llama-3.1-8b-4-layers", LLAMA_8B_4_LAYERS))
                 for f in SWEEP_FEATURES for s in (16384, 65536, 131072)]
    else:  # one row per feature set, and one predicted not to fit the rehearsal's small custom device
        cases = [("tiny", CPU_MODEL, f, s) for f, s in (("plain", 512), ("alst", 512), ("plain", 2048))]
    out += [Row("sweep", f"sweep-{m}-{f}-{s}", m, cfg, s, f, SWEEP_FEATURES[f], 2, one_document=True)
            for m, cfg, f, s in cases]
    from plan import estimate

    for r in out:
        r.estimate = estimate(ck.plan(r))
    # shortest first within a part, so a spent budget cuts the longest rows; rows predicted not to fit at the end
    return sorted(out, key=lambda r: (r.fits is False, PARTS.index(r.part), r.seq_len))


def build_ops() -> None:
    """DeepSpeedCPUAdam's JIT build (g++, ninja; ~1 min), once, before any row and outside every row's timeout: a
    row killed mid-build would leave torch's build lock behind, and every later build would wait on it forever."""
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", "from worker.trainer.cli import build_cpu_adam; build_cpu_adam()"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    print(f"DeepSpeedCPUAdam build: {'ok' if proc.returncode == 0 else 'FAILED: ' + last[0]} "
          f"({time.monotonic() - t:.0f} s)", flush=True)


def select(rows: list[Row], parts: set[str], only: str | None, skip: str | None) -> list[Row]:
    return [r for r in rows if r.part in parts and (not only or re.search(only, r.name))
            and not (skip and re.search(skip, r.name))]


def append_row(path: Path, row: dict) -> None:
    """One CSV row, written and flushed to disk now (a later kill loses nothing written so far)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow({k: ("" if v is None else v) for k, v in row.items()})
        f.flush()
        os.fsync(f.fileno())


def has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def catalog_gpu(name: str) -> str | dict:
    """The catalog GPU this device is (by name), else a custom GPU with its real memory and H100's other figures."""
    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    for key, catalog_name in (("H200", "H200-141GB"), ("H100", "H100-80GB"), ("B200", "B200-180GB"),
                              ("A100", "A100-80GB" if total > 50e9 else "A100-40GB")):
        if key in name:
            return catalog_name
    return {"name": name, "memory_gib": total / 2**30, "hbm_tb_per_s": 3.35, "bf16_dense_tflops": 989,
            "nvlink_gb_per_s_per_direction": 450, "typical_internode_gb_per_s": 50}


def smi_used_gib() -> float | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True).stdout.strip()
    return float(out.splitlines()[0]) / 1024 if out else None


class SmiPeak(threading.Thread):
    """Polls nvidia-smi's used memory of GPU 0 while a run goes on; `peak_gib` is None without nvidia-smi."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_gib: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            used = smi_used_gib()
            if used is None:
                return
            self.peak_gib = max(self.peak_gib or 0.0, used)
            self.done.wait(0.2)


def rnd(v, n: int = 4):
    return None if v is None else round(float(v), n)


def error_pct(predicted, measured):
    if predicted in (None, "") or not measured:
        return None
    return round(100 * (float(predicted) - float(measured)) / float(measured), 1)


def format_row(r: dict) -> str:
    def f(v):
        return "-" if v in (None, "") else (f"{v:.3g}" if isinstance(v, float) else str(v))

    return (f"{r['name']:<38} {r['status']:<8} allocated {f(r.get('measured_allocated_gib'))} GiB "
            f"(predicted {f(r.get('predicted_allocated_gib'))}), reserved {f(r.get('measured_reserved_gib'))} "
            f"({f(r.get('predicted_reserved_gib'))}), device {f(r.get('nvidia_smi_gib'))} "
            f"({f(r.get('predicted_device_gib'))}), step {f(r.get('step_time_s'))} s "
            f"({f(r.get('predicted_step_time_s'))}), tokens/s {f(r.get('tokens_per_s'))} "
            f"({f(r.get('predicted_tokens_per_s'))}), mfu {f(r.get('mfu'))} ({f(r.get('predicted_mfu'))})")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder the CSV is appended in")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    ap.add_argument("--only", default=None, help="run only rows whose name matches this regex")
    ap.add_argument("--skip", default=None, help="leave out rows whose name matches this regex")
    ap.add_argument("--cpu", action="store_true", help="every part on CPU ranks, tiny sizes (make gpu-rehearsal)")
    ap.add_argument("--require-cuda", action="store_true", help="exit 2 when no CUDA device is found")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("GPU_CHECK_BUDGET_S", "540")))
    ap.add_argument("--t0", type=float, default=None, help="unix time the budget counts from (default: now)")
    ap.add_argument("--min-row-s", type=float, default=45.0, help="a row starts only with this much budget left")
    ap.add_argument("--run-timeout-s", type=float, default=240.0)
    ap.add_argument("--list", action="store_true", help="print the rows (with predictions) and exit")
    a = ap.parse_args(argv)
    a.part_set = {p.strip() for p in a.parts.split(",") if p.strip()}
    unknown = a.part_set - set(PARTS)
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; known: {', '.join(PARTS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"error: torch cannot be imported by {sys.executable} ({e}): nothing was checked", file=sys.stderr)
        return 2
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if not cuda and a.require_cuda:
        print(f"error: --require-cuda and no CUDA device (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda})", file=sys.stderr)
        return 2
    if not cuda and not a.cpu:
        print("no CUDA device: GPU check skipped")
        return 0
    ck = Check(a, cuda)
    rows = select(rows_for(ck), a.part_set, a.only, a.skip)
    if not a.list and any(r.training.get("offload_optimizer") for r in rows):
        build_ops()
    spent = time.time() - ck.t0
    print(f"GPU check on {ck.device_name} ({torch.cuda.device_count() if cuda else 0} CUDA devices); torch "
          f"{torch.__version__} (CUDA {torch.version.cuda}); flash-attn {'present' if ck.flash else 'missing'}; "
          f"liger-kernel {'present' if ck.liger else 'missing'}; {len(rows)} rows; {spent:.0f} s of the "
          f"{a.budget_s:.0f} s budget spent before the first row; CSV: {ck.csv}", flush=True)
    if a.list:
        for r in rows:
            print(f"  {r.part:<8} {r.name:<38} predicted fits: {r.fits}")
        return 0
    for r in rows:
        if r.name == "suite-resume":
            ck.resume(r)
        else:
            ck.run_row(r)
    if cuda and torch.cuda.device_count() == 1 and "ulysses" in a.part_set:
        print("unproven on one GPU: NCCL between devices, the all-to-all's NVLink time, each device's own memory "
              "under SP (both ranks share one here)")
    print(f"\n{len(ck.failures)} failure(s)" + "".join(f"\n  {x}" for x in ck.failures) + f"\nrows in {ck.csv}")
    shutil.rmtree(ck.work, ignore_errors=True)
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
