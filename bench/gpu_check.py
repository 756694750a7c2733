"""`make gpu-check`: the trainer on real GPUs, and the planner's memory model against the CUDA allocator.

Not part of `make test`. Without a CUDA device it prints "no CUDA device: GPU check skipped" and exits 0. With one:

1. Suite (one GPU; random weights from configs, generated data, no downloads): ZeRO-2, ZeRO-3, every ALST
   feature (ZeRO-3 + optimizer and parameter offload with DeepSpeedCPUAdam, activation checkpointing with
   offload, TiledMLP, tiled logits loss), flash_attention_2, Liger, and a checkpoint-resume. Each must exit 0
   with `mfu` set and the CUDA allocator's peak memory in metrics.jsonl.
2. Sweep: seq_len for a ~1B Llama (Llama-3.2-1B's shape) and for Llama-3.1-8B's layer shape (4 of its 32
   layers, so it fits one GPU; the planner predicts the same 4-layer config), with and without the memory
   features. Each row: measured max_memory_allocated / max_memory_reserved (the trainer's metrics), nvidia-smi's
   used memory (polled), the planner's prediction, and the error. Written to bench/results/gpu-<gpu>-<date>.csv
   and printed as a table.
2b. Probe (issue 27): `ulab probe` of the ~1B Llama (1, 2, 4 layers, extrapolated to 16, and its real 16-layer run)
   and of Llama-3.1-8B's full 32-layer shape (1, 2, 4 layers; the full model does not fit one GPU without offload,
   so only the planner is beside it). Prints the extrapolation's error against the full run where there is one.
3. With 2 or more GPUs: the SP suite on NCCL (sp2, sp2 + ZeRO-3, sp2 + flash), each compared step by step with
   the one-GPU run on the same rows.

Where flash-attn is not importable, runs that ask for flash_attention_2 measure sdpa instead (one document per row:
`is_causal`, which takes torch's flash kernel) and the kernel column says so. Time budget: GPU_CHECK_BUDGET_S
(default 540 s); rows that no longer fit in it are written as skipped.
"""
from __future__ import annotations

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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.gpu_models import LLAMA_1B, LLAMA_8B_4_LAYERS, SUITE_MODEL, write_long_documents  # noqa: E402

RESULTS = ROOT / "bench" / "results"
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", "540"))
RUN_TIMEOUT_S = 240
ALST = {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "activation_checkpointing": True,
        "checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True}
SWEEP_FEATURES = {
    "plain": {"zero_stage": 3, "activation_checkpointing": True},
    "tiled": {"zero_stage": 3, "activation_checkpointing": True, "tiled_mlp": True, "tiled_logits_loss": True},
    "alst": ALST,
}
SWEEP_SEQ = [16384, 65536, 131072]
MODELS = (("llama-1b", LLAMA_1B), ("llama-3.1-8b-4-layers", LLAMA_8B_4_LAYERS))


def cuda_devices() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def catalog_gpu(name: str) -> str | dict:
    """The catalog GPU this device is (by name), else a custom GPU with its real memory and H100's other figures."""
    import torch

    for key, catalog_name in (("H200", "H200-141GB"), ("H100", "H100-80GB"), ("B200", "B200-180GB"),
                              ("A100", "A100-80GB" if torch.cuda.get_device_properties(0).total_memory > 50e9
                               else "A100-40GB")):
        if key in name:
            return catalog_name
    return {"name": name, "memory_gib": torch.cuda.get_device_properties(0).total_memory / 2**30,
            "hbm_tb_per_s": 3.35, "bf16_dense_tflops": 989, "nvlink_gb_per_s_per_direction": 450,
            "typical_internode_gb_per_s": 50}


class Ctx:
    def __init__(self, work: Path, gpu: str | dict, flash: bool):
        self.work, self.gpu, self.flash = work, gpu, flash
        self.start = time.monotonic()
        self.data_short = write_long_documents(work / "short.txt", doc_len=3000, total=1_000_000)

    def one_document_rows(self, seq_len: int) -> Path:
        """Documents of seq_len - 1 bytes: with EOS, each packed row is exactly one document."""
        return write_long_documents(self.work / f"docs-{seq_len}.txt", doc_len=seq_len - 1, total=4 * seq_len)

    @property
    def left_s(self) -> float:
        return BUDGET_S - (time.monotonic() - self.start)

    @property
    def attn(self) -> str:
        return "flash_attention_2" if self.flash else "sdpa"

    @property
    def kernel(self) -> str:
        return "flash-attn varlen" if self.flash else "sdpa is_causal (torch flash kernel; flash-attn missing)"


def plan(ctx: Ctx, model: dict, *, seq_len: int, steps: int, gpus: int = 1, sp: int = 1, gas: int = 1,
         data: Path | None = None, training: dict | None = None, **run) -> dict:
    t = {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": gas, "dtype": "bf16", "zero_stage": 2,
         "activation_checkpointing": False, "attn_implementation": ctx.attn}
    t.update(training or {})
    return {"model": {"config": dict(model)},
            "hardware": {"gpu": ctx.gpu, "gpus_per_node": gpus, "num_nodes": 1},
            "parallel": {"sp_size": sp, "dp_size": gpus // sp}, "training": t,
            "run": {"steps": steps, "learning_rate": 1e-4, "seed": 0, "data": {"path": str(data or ctx.data_short)},
                    "model_path": None, "checkpoint_every": 0, **run}}


class SmiPeak(threading.Thread):
    """Polls nvidia-smi's used memory of GPU 0 while a run goes on; `peak_gib` is None without nvidia-smi."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_gib: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        if shutil.which("nvidia-smi") is None:
            return
        while not self.done.is_set():
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True).stdout.strip()
            if out:
                self.peak_gib = max(self.peak_gib or 0.0, float(out.splitlines()[0]) / 1024)
            self.done.wait(0.2)


def train(ctx: Ctx, name: str, p: dict, resume: bool = False) -> tuple[int, list[dict], str, float | None]:
    run_dir = ctx.work / name
    plan_path = ctx.work / f"{name}.json"
    plan_path.write_text(json.dumps(p))
    cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    smi = SmiPeak()
    smi.start()
    try:
        proc = subprocess.run(cmd + (["--resume"] if resume else []), capture_output=True, text=True, env=env,
                              timeout=min(RUN_TIMEOUT_S, max(30.0, ctx.left_s)), cwd=ROOT)
        code, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        code, out = 124, f"timed out after {e.timeout:.0f} s"
    finally:
        smi.done.set()
        smi.join()
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return code, rows, out, smi.peak_gib


def suite(ctx: Ctx) -> list[str]:
    """The one-GPU runs; returns the failures (empty: all passed)."""
    runs = {"zero2": {}, "zero3": {"zero_stage": 3}, "alst": ALST}
    if ctx.flash:
        runs["flash_attention_2"] = {"attn_implementation": "flash_attention_2", "zero_stage": 3}
    if has("liger_kernel"):
        runs["liger"] = {"liger_kernel": True}
        runs["liger+alst"] = {**ALST, "liger_kernel": True}
    failures = []
    for name, training in runs.items():
        p = plan(ctx, SUITE_MODEL, seq_len=8192, steps=4, training=training)
        code, rows, out, _ = train(ctx, f"suite-{name}", p)
        failures += check_run(f"suite {name}", code, rows, out, steps=4)
        offloaded = re.search(r"checkpoint offload, last micro batch: (\d+) hidden states offloaded", out)
        if name == "alst" and code == 0 and not (offloaded and int(offloaded.group(1)) > 0):
            failures.append("suite alst: activation-checkpoint offload moved nothing to the host")
        if name == "alst" and "optimizer: DeepSpeedCPUAdam" not in out:
            failures.append("suite alst: the offloaded optimizer is not DeepSpeedCPUAdam")
    if not has("liger_kernel"):
        print("suite liger: liger-kernel is not installed: not run")
    if not ctx.flash:
        print("suite flash_attention_2: flash-attn is not installed: not run (the other runs measure sdpa)")
    # checkpoint after step 3, run on to 5; resume from 3: steps 4-5 again, the same losses (bf16: 2%)
    p = plan(ctx, SUITE_MODEL, seq_len=8192, steps=5, checkpoint_every=3, training={"zero_stage": 3})
    code, first, out, _ = train(ctx, "suite-resume", p)
    failures += check_run("suite resume (first)", code, first, out, steps=5)
    code, again, out, _ = train(ctx, "suite-resume", p, resume=True)
    failures += check_run("suite resume (again)", code, again, out, steps=5)
    if code == 0 and len(first) == len(again) == 5:
        for a, b in zip(first[3:], again[3:]):
            if abs(a["loss"] - b["loss"]) > 0.02 * abs(a["loss"]):
                failures.append(f"suite resume: step {a['step']} loss {b['loss']} after resume vs {a['loss']}")
    return failures


def check_run(label: str, code: int, rows: list[dict], out: str, steps: int) -> list[str]:
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if code != 0:
        return [f"{label}: exit {code}: {last}"]
    problems = []
    if [r["step"] for r in rows] != list(range(1, steps + 1)):
        problems.append(f"{label}: steps {[r['step'] for r in rows]}")
    if rows and (rows[-1].get("mfu") is None or rows[-1].get("memory_measure") != "cuda_allocator"
                 or not all(v and v > 0 for v in rows[-1].get("peak_allocated_gib") or [None])):
        problems.append(f"{label}: mfu or CUDA peak memory missing: {rows[-1]}")
    print(f"{label}: {'ok' if not problems else 'FAILED'} (exit {code}, {len(rows)} steps, "
          f"mfu {rows[-1].get('mfu') if rows else None})", flush=True)
    return problems


def sweep(ctx: Ctx) -> list[dict]:
    from plan import estimate

    out = []
    # shortest sequences first over every model and feature set, so a spent time budget cuts the longest rows
    cases = [(seq, model_name, model, features, training) for model_name, model in MODELS
             for features, training in SWEEP_FEATURES.items() for seq in SWEEP_SEQ]
    for seq, model_name, model, features, training in sorted(cases, key=lambda c: c[0]):
        p = plan(ctx, model, seq_len=seq, steps=2, data=ctx.one_document_rows(seq), training=training)
        e = estimate(p)
        row = {"model": model_name, "seq_len": seq, "features": features, "kernel": ctx.kernel,
               "plan": json.dumps({k: v for k, v in p.items() if k != "run"}),
               "predicted_allocated_gib": e["memory"]["peak_allocated_gib"] if e["valid"] else None,
               "predicted_device_gib": e["memory"]["device_total_gib"] if e["valid"] else None,
               "predicted_fits": e["memory"]["fits"] if e["valid"] else None}
        if ctx.left_s < 45:
            out.append({**row, "status": "skipped (time budget)"})
            continue
        code, rows, log, smi = train(ctx, f"sweep-{model_name}-{features}-{seq}", p)
        row["status"] = {0: "ok", 3: "oom"}.get(code, f"exit {code}")
        if code not in (0, 3):
            print(log.strip().splitlines()[-1] if log.strip() else "", flush=True)
        if rows:
            row["measured_allocated_gib"] = max(r["peak_allocated_gib"][0] for r in rows)
            row["measured_reserved_gib"] = max(r["peak_reserved_gib"][0] for r in rows)
            row["step_time_s"] = rows[-1]["step_time_s"]
            row["tokens_per_s"] = rows[-1]["tokens_per_s"]
            row["mfu"] = rows[-1]["mfu"]
        row["nvidia_smi_gib"] = smi
        out.append(row)
        print(format_row(row), flush=True)
    return out


def error_pct(predicted, measured):
    return None if predicted is None or not measured else round(100 * (predicted - measured) / measured, 1)


def format_row(r: dict) -> str:
    def f(v):
        return "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))

    alloc, pred = r.get("measured_allocated_gib"), r.get("predicted_allocated_gib")
    smi, device = r.get("nvidia_smi_gib"), r.get("predicted_device_gib")
    return (f"{r['model']:<22} {r['seq_len']:>7} {r['features']:<6} {r['status']:<8} "
            f"allocated {f(alloc)} GiB, predicted {f(pred)} ({f(error_pct(pred, alloc))}%); "
            f"nvidia-smi {f(smi)} GiB, predicted device total {f(device)} ({f(error_pct(device, smi))}%)")


def probe_check(ctx: Ctx) -> list[str]:
    """Probes on one GPU: the 1B model against its full-depth run, the 8B shape against the planner only."""
    from worker.probe import probe

    failures = []
    llama_8b = {**LLAMA_8B_4_LAYERS, "num_hidden_layers": 32}
    for label, model, full in (("probe 1B", LLAMA_1B, True), ("probe 8B", llama_8b, False)):
        if ctx.left_s < 120:
            print(f"{label}: skipped (time budget)")
            continue
        p = plan(ctx, model, seq_len=4096, steps=4)
        del p["run"]
        try:
            r = probe(p, ctx.work / label.replace(" ", "-"), (1, 2, 4), 4, full=full, timeout_s=max(60.0, ctx.left_s))
        except Exception as e:  # noqa: BLE001 - a failed probe is a failure of the check, not of the script
            failures.append(f"{label}: {type(e).__name__}: {e}")
            continue
        bad = [m for m in r["measured"] if m["status"] != "ok"]
        if bad:
            failures.append(f"{label}: " + "; ".join(f"depth {m['depth']} {m['status']}: {m.get('reason')}"
                                                     for m in bad))
        e, pred = r["extrapolated"], r["predicted"]
        print(f"{label}: extrapolated to {r['plan_depth']} layers: allocated {e['peak_allocated_gib']} GiB, "
              f"reserved {e['reserved_gib']} GiB, nvidia-smi {e['device_total_gib']} GiB, {e['tokens_per_s']} "
              f"tokens/s; planner {pred['peak_allocated_gib']} / {pred['reserved_gib']} / {pred['device_total_gib']} "
              f"GiB, {pred['tokens_per_s']} tokens/s; {r['verdict']['text']}", flush=True)
        for q, c in r["check"].items():
            print(f"  {q}: line vs the real {r['plan_depth']}-layer run: error {c['error']}")
    return failures


def sp_suite(ctx: Ctx) -> list[str]:
    """2 GPUs on NCCL: sp2 against one GPU with grad_accum 2 (the same rows per step)."""
    failures = []
    cases = {"sp2": ({"dtype": "fp32", "attn_implementation": "sdpa"}, 1e-4),
             "sp2-zero3": ({"dtype": "fp32", "attn_implementation": "sdpa", "zero_stage": 3}, 1e-4)}
    if ctx.flash:
        cases["sp2-flash"] = ({"attn_implementation": "flash_attention_2"}, 2e-2)
    for name, (training, tol) in cases.items():
        _, one, out1, _ = train(ctx, f"sp-{name}-one", plan(ctx, SUITE_MODEL, seq_len=8192, steps=4, gas=2,
                                                             training=training))
        code, two, out2, _ = train(ctx, f"sp-{name}", plan(ctx, SUITE_MODEL, seq_len=8192, steps=4, gpus=2, sp=2,
                                                           gas=2, training=training))
        failures += check_run(f"{name} (1 GPU)", 0 if one else 1, one, out1, steps=4)
        failures += check_run(f"{name} (2 GPUs, NCCL)", code, two, out2, steps=4)
        for a, b in zip(one, two):
            if abs(a["loss"] - b["loss"]) > tol * abs(a["loss"]):
                failures.append(f"{name}: step {a['step']} loss {b['loss']} on 2 GPUs vs {a['loss']} on 1")
    return failures


# The columns of bench/results/gpu-*.csv. The API loads these files as measured calibration rows
# (backend/calibration/service.py load_results reads `plan` and the measured_* / nvidia_smi_gib / tokens_per_s columns).
RESULT_FIELDS = ["model", "seq_len", "features", "kernel", "status", "measured_allocated_gib",
                 "predicted_allocated_gib", "allocated_error_pct", "measured_reserved_gib", "nvidia_smi_gib",
                 "predicted_device_gib", "device_error_pct", "predicted_fits", "step_time_s", "tokens_per_s", "mfu",
                 "plan"]


def write_results(rows: list[dict], out: Path) -> None:
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=RESULT_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({**r, "allocated_error_pct": error_pct(r.get("predicted_allocated_gib"),
                                                              r.get("measured_allocated_gib")),
                        "device_error_pct": error_pct(r.get("predicted_device_gib"), r.get("nvidia_smi_gib"))})


def main() -> int:
    n = cuda_devices()
    if n == 0:
        print("no CUDA device: GPU check skipped")
        return 0
    import torch

    name = torch.cuda.get_device_name(0)
    flash = has("flash_attn")
    print(f"GPU check on {n} x {name}; torch {torch.__version__} (CUDA {torch.version.cuda}); flash-attn "
          f"{'present' if flash else 'missing: flash_attention_2 runs measure sdpa'}; liger-kernel "
          f"{'present' if has('liger_kernel') else 'missing'}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="ulab-gpu-check-"))
    ctx = Ctx(work, catalog_gpu(name), flash)
    failures = suite(ctx)
    failures += probe_check(ctx)
    if n >= 2:
        failures += sp_suite(ctx)
    else:
        print("SP suite on NCCL: needs 2 GPUs, this machine has 1: not run")
    rows = sweep(ctx)  # last: it spends what is left of the time budget
    RESULTS.mkdir(parents=True, exist_ok=True)
    slug = "".join(c if c.isalnum() else "-" for c in name).strip("-").lower()
    out = RESULTS / f"gpu-{slug}-{datetime.date.today().isoformat()}.csv"
    write_results(rows, out)
    print(f"\nmeasured vs predicted ({out.relative_to(ROOT)}):")
    for r in rows:
        print(format_row(r))
    print(f"\n{len(failures)} failure(s)" + "".join(f"\n  {x}" for x in failures))
    shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
