"""How far the probe's depth line lands from a real full-depth run, on CPU ranks.

For each layout (sp 1/2 x ZeRO 2/3) and model depth (8 and 16 layers) of a small Llama-shaped model: `ulab probe`
at 1, 2 and 4 layers plus --full (the real run of the same plan at full depth), then the relative error of the
extrapolated per-rank peak allocated memory (CPU: the trainer's live-tensor count), step time and, where the
trainer records them, its forward / backward / optimizer parts against it, and the seconds of the probe's one
torchrun launch (all depths; worker/trainer/probe_ranks.py). Every row is real training under torchrun (gloo);
prints figures, asserts nothing.

Usage: .venv/bin/python bench/probe.py [--depths 8,16] [--sp 1,2] [--zero 2,3] [--steps 3] [--seq-len 256]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plan.probe import PARTS
from tests.tiny import tiny_plan
from worker.probe import probe


def plan(layers: int, sp: int, zero: int, seq_len: int) -> dict:
    p = tiny_plan(sp_size=sp, seq_len=seq_len, zero_stage=zero)
    p["model"]["config"]["num_hidden_layers"] = layers
    return p


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--depths", default="8,16")
    p.add_argument("--sp", default="1,2")
    p.add_argument("--zero", default="2,3")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seq-len", type=int, default=256)
    a = p.parse_args()
    print(f"{'layers':>6} {'sp':>3} {'zero':>4} | {'memory error per rank (extrapolated vs full run)':>48} | "
          f"{'step time error':>15} | {'fwd/bwd/opt error':>22} | {'launch s':>8} | {'seconds':>7}")
    worst = 0.0
    for layers in ints(a.depths):
        for sp in ints(a.sp):
            for zero in ints(a.zero):
                t0 = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="bench-probe-") as tmp:
                    r = probe(plan(layers, sp, zero, a.seq_len), Path(tmp), (1, 2, 4), a.steps, full=True)
                check = r["check"]
                mem = check.get("peak_allocated_gib", {}).get("error") or []
                step = check.get("step_time_s", {}).get("error")
                worst = max([worst, *(abs(e) for e in mem if e is not None)])
                mem_text = ", ".join(f"{e:+.1%}" for e in mem if e is not None) or "-"
                step_text = f"{step:+.1%}" if step is not None else "-"
                parts = [check.get(p, {}).get("error") for p in PARTS]
                parts_text = "/".join(f"{e:+.0%}" if e is not None else "-" for e in parts) \
                    if any(e is not None for e in parts) else "not measured"
                print(f"{layers:>6} {sp:>3} {zero:>4} | {mem_text:>48} | {step_text:>15} | {parts_text:>22} | "
                      f"{r.get('wall_s') or 0:8.0f} | {time.perf_counter() - t0:7.0f}", flush=True)
    print(f"worst memory error: {worst:.1%}")


if __name__ == "__main__":
    main()
