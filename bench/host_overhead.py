"""The host side of a training step, per layer, pass, ZeRO stage and feature, measured on a CPU rank.

    .venv/bin/python bench/host_overhead.py [--steps 12] [--depths 4 32] [--seq-lens 64 256] [--only z3-ac ...]

Each variant trains a real-depth, tiny-width Llama (hidden 64, 4 heads, MLP 128, vocabulary 512) with `ulab train`
on one CPU rank (torchrun, gloo), at two depths and two sequence lengths. At this width the arithmetic is a small
part of a step, and what grows with the tokens is taken out by extrapolating to zero tokens (the `host` column); what
is left is what the host does whatever the device: the Python of Transformers' modules, Accelerate, the Trainer
and our callback, DeepSpeed's hooks per module (ZeRO-3 fetch and release per module, the gradient hooks of
ZeRO-2), TiledMLP's shards and the per-micro-batch bookkeeping. The trainer's own phases (forward_s, backward_s,
optimizer_s of metrics.jsonl) are read per step; the per-layer cost of a phase is the difference between the two
depths divided by the difference in layers, and what does not grow with depth is the step's fixed part. TiledMLP
runs seq_len / hidden shards, so its variant is read at the longer length only.
Per phase the least of the steps after the second is used (the first steps carry start-up work; the machine is
shared, and the least-disturbed step is the closest to the uncontended cost); the median is printed beside it.
Both are upper bounds of the uncontended cost.

On a GPU the host issues the same calls and launches a kernel for each operation instead of running it; the
device cannot finish a step before the host has issued it, so these figures are a floor under the step time
(plan/host.py reads them from the table this script prints, docs/host-overhead.md).
Prints figures; asserts nothing.
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
ULAB = Path(sys.executable).parent / "ulab"
PHASES = ("forward_s", "backward_s", "optimizer_s", "step_time_s")

# name: (training fields, what the variant shows)
VARIANTS = {
    "z2": ({"zero_stage": 2}, "ZeRO-2, no activation checkpointing"),
    "z2-ac": ({"zero_stage": 2, "activation_checkpointing": True}, "ZeRO-2 + activation checkpointing"),
    "z3": ({"zero_stage": 3}, "ZeRO-3 (fetch/release hooks per module)"),
    "z3-ac": ({"zero_stage": 3, "activation_checkpointing": True}, "ZeRO-3 + activation checkpointing"),
    "z3-ac-tiled": ({"zero_stage": 3, "activation_checkpointing": True, "tiled_mlp": True},
                    "ZeRO-3 + AC + TiledMLP (seq_len / hidden shards per MLP)"),
    "z3-ac-ga2": ({"zero_stage": 3, "activation_checkpointing": True, "grad_accum": 2},
                  "ZeRO-3 + AC, 2 micro batches per step"),
}


def make_plan(data: Path, layers: int, steps: int, seq_len: int, training: dict) -> dict:
    t = {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
         "attn_implementation": "sdpa", "activation_checkpointing": False}
    t.update(training)
    return {
        "model": {"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": layers,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                             "vocab_size": 512, "max_position_embeddings": 4096}},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1, "num_nodes": 1},
        "parallel": {"sp_size": 1, "dp_size": 1},
        "training": t,
        "run": {"steps": steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None,
                "track_memory": False, "checkpoint_every": 0},
    }


def run_variant(tmp: Path, name: str, plan: dict) -> dict[str, tuple[float, float]]:
    """(least, median) seconds per phase over the steps after the second."""
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(plan))
    rd = tmp / name
    env = dict(os.environ, ULAB_TRAINER_SKIP_FINAL_SAVE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip()[-2000:]}")
    rows = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    later = rows[2:] or rows
    return {k: (min(r[k] for r in later), statistics.median(r[k] for r in later)) for k in PHASES}


def fit(at: dict, lo: int, hi: int, k: str) -> tuple[float, float]:
    """(per layer, fixed) seconds of phase k from the least step times at the two depths."""
    per_layer = (at[hi][k][0] - at[lo][k][0]) / (hi - lo)
    return per_layer, at[lo][k][0] - lo * per_layer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--depths", type=int, nargs=2, default=(4, 32))
    ap.add_argument("--seq-lens", type=int, nargs=2, default=(64, 256))
    ap.add_argument("--only", nargs="*", default=list(VARIANTS))
    a = ap.parse_args()
    lo, hi = a.depths
    short, long = a.seq_lens
    print(f"one CPU rank (torchrun, gloo), fp32, hidden 64, {a.steps} steps, depths {lo} and {hi}, seq_len {short} and "
          f"{long}; least of steps 3..{a.steps} (median in brackets); ms. per layer / fixed: at each length; host: "
          "extrapolated to zero tokens")
    print(f"{'variant':12s} {'phase':12s} {'seq':>5s} {'L=' + str(lo):>18s} {'L=' + str(hi):>18s} {'per layer':>10s} "
          f"{'fixed':>8s} {'host/layer':>10s} {'host fixed':>10s}")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        docs = tmp / "docs.txt"
        docs.write_text("\n\n".join(f"document {i} " + "words of text " * (20 + i % 50) for i in range(3000)))
        for name in a.only:
            training, what = VARIANTS[name]
            lengths = (long,) if training.get("tiled_mlp") else (short, long)
            at = {(n, s): run_variant(tmp, f"{name}-L{n}-S{s}", make_plan(docs, n, a.steps, s, training))
                  for s in lengths for n in (lo, hi)}
            print(f"{name}: {what}")
            for k in PHASES:
                fits = {s: fit({n: at[(n, s)] for n in (lo, hi)}, lo, hi, k) for s in lengths}
                for s in lengths:
                    (m_lo, med_lo), (m_hi, med_hi) = at[(lo, s)][k], at[(hi, s)][k]
                    zero = ""
                    if s == long and len(lengths) == 2:
                        zero = "".join(f" {1000 * (x - (y - x) * short / (long - short)):10.3f}"
                                       for x, y in zip(fits[short], fits[long]))
                    print(f"{'':12s} {k:12s} {s:5d} {1000 * m_lo:8.2f} ({1000 * med_lo:7.2f}) {1000 * m_hi:8.2f} "
                          f"({1000 * med_hi:7.2f}) {1000 * fits[s][0]:10.3f} {1000 * fits[s][1]:8.2f}{zero}",
                          flush=True)


if __name__ == "__main__":
    main()
