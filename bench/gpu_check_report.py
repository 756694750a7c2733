"""`make gpu-check`'s report (bench/gpu_check.py): the CSV's columns and rows, the printed line per row, and what the
device says (its catalog name, nvidia-smi's used memory)."""
from __future__ import annotations

import csv
import os
import shutil
import subprocess
import threading
from pathlib import Path

# the columns of OUT/gpu-*.csv; backend/calibration/service.py load_results reads `status`, `plan` and the
# measured ones, and loads only rows whose status is "ok"
FIELDS = ["part", "name", "status", "model", "seq_len", "features", "kernel", "predicted_fits",
          "predicted_allocated_gib", "measured_allocated_gib", "allocated_error_pct",
          "predicted_reserved_gib", "measured_reserved_gib", "reserved_error_pct",
          "predicted_device_gib", "nvidia_smi_gib", "device_error_pct", "nvidia_smi_idle_gib",
          "predicted_step_time_s", "step_time_s", "predicted_tokens_per_s", "tokens_per_s", "predicted_mfu", "mfu",
          # the measured step's parts (the trainer's phases, slowest rank; medians like step_time_s) and the
          # trainer's own per-step bookkeeping: where a step's time goes when it is far from the prediction
          "forward_s", "backward_s", "optimizer_s", "metrics_overhead_s", "bare_step_time_s",
          "extrapolated_allocated_gib", "extrapolated_step_time_s", "extrapolation_allocated_error_pct",
          "extrapolation_step_time_error_pct", "wall_s", "note", "plan"]



def append_row(path: Path, row: dict) -> None:
    """One CSV row, written and flushed to disk now (a later kill loses nothing written so far)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    fields = FIELDS
    if not new:  # a file an older check began: its own columns, so every row stays under its header
        with path.open(newline="") as f:
            fields = next(csv.reader(f), FIELDS)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
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
