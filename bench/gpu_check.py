"""`make gpu-check`: the trainer on a real GPU, and the planner's prediction beside what the run measured.

Not part of `make test`. Exits 2 when torch cannot be imported; 2 with `--require-cuda` and no CUDA device; without
CUDA and without `--cpu` it prints "no CUDA device: GPU check skipped" and exits 0. docs/gpu-check.md has the
commands for a GPU machine lent for 30 minutes; a 15-minute window is one call of bench/gpu_check_window.py, which
runs some of these rows beside the kernel benches. `make gpu-rehearsal` runs all of this on CPU ranks (`--cpu`).

Parts (`--parts`, default all; `--only REGEX` / `--skip REGEX` filter rows by name; `--list` prints the rows):
  suite    one device: ZeRO-2, ZeRO-3, every ALST feature (ZeRO-3 + optimizer and parameter offload with
           DeepSpeedCPUAdam, activation checkpointing with offload, TiledMLP, tiled loss), flash_attention_2 and
           Liger where installed, and a checkpoint-resume whose second attempt's metrics (metrics.attempt-2.jsonl)
           must repeat the first attempt's steps 4-5.
  overhead the trainer's step time against bench/bare_loop.py's (Accelerate + DeepSpeed + the same model, data,
           optimizer and loss; no Trainer, no callbacks) on the same run directory: how much of a step is ours.
  ulysses  SP=2 against one rank with grad_accum 2 (the same rows per step), step by step. With one GPU both ranks
           share it over gloo (ULAB_TRAINER_SHARE_DEVICE): the Ulysses all-to-all, the sharded loss and ZeRO on
           CUDA tensors run; NCCL, NVLink bandwidth and two devices' memory stay unproven (docs/gpu-check.md).
  sweep    seq_len for a ~1B Llama and Llama-3.1-8B's layer shape (4 of 32 layers), with and without the
           memory features: the planner's prediction beside the measurement.
  probe    `ulab probe` (all depths in one launch) at 1, 2 and 4 layers of a ~1B Llama (16 layers) and of
           Llama-3.1-8B's shape (32 layers, and 8), extrapolated to the full depth and compared with the full-depth
           run where the planner predicts it fits (bench/gpu_check_probe.py). CPU: a tiny model at 8 and 16 layers.

Every row, as it finishes, is appended to OUT/gpu-<gpu>-<date>.csv (`--out`, default bench/results; on CPU
OUT/cpu-rehearsal-<date>.csv, which calibration never reads): predicted and measured peak allocated, reserved,
device total (nvidia-smi's used memory less its idle reading before the first row), step time, tokens/s, MFU.
Rows predicted not to fit run last; the final model is not saved (ULAB_TRAINER_SKIP_FINAL_SAVE); each run
directory is deleted once its metrics are read. Time budget `--budget-s` from `--t0` (scripts/gpu_wheels.sh
passes the install's start, so the install counts): a row that no longer fits in it is written as skipped.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# the check's modules (rows, running, report, the probe part); the names tests and the calibration loader use are
# re-exported here
from bench.gpu_check_probe import run_probe_row  # noqa: E402
from bench.gpu_check_report import FIELDS, append_row, format_row  # noqa: E402,F401
from bench.gpu_check_rows import PARTS, Row, rows_for, select  # noqa: E402,F401
from bench.gpu_check_run import Check, build_ops  # noqa: E402


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
        elif r.part == "overhead":
            ck.overhead(r)
        elif r.part == "probe":
            run_probe_row(ck, r)
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
