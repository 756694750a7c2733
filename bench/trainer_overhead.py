"""Cost of the per-step metrics callback (one all_gather + one JSON line per step) against a bare loop of the same
Trainer (ULAB_TRAINER_BARE=1 leaves the callback out), on real `ulab train` SP=2 CPU runs.

Three variants, each run `--repeat` times (the minimum train time is kept: the machine is shared):
  bare                     the Trainer loop alone
  callback                 + metrics callback, memory measure off (run.track_memory: false)
  callback + tensor memory + the CPU tensor-memory tracker (a TorchDispatchMode on every op; on GPU the
                             allocator statistics cost nothing, so this row is the CPU-only price)
The wall-clock comparison is noisy on a shared machine; the run also measures the time spent inside the
callback each step (metrics_overhead_s), whose median share of step time is printed too.
Prints figures; asserts nothing. Usage: .venv/bin/python bench/trainer_overhead.py [--steps 30] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ULAB = Path(sys.executable).parent / "ulab"


def make_plan(data: Path, steps: int, seq_len: int, track_memory: bool) -> dict:
    return {
        "model": {"config": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688,
                             "vocab_size": 4096,
                             "max_position_embeddings": 4096}},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 2, "num_nodes": 1},
        "parallel": {"sp_size": 2, "dp_size": 1},
        "training": {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "attn_implementation": "sdpa"},
        "run": {"steps": steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None,
                "track_memory": track_memory},
    }


def train_seconds(tmp: Path, name: str, plan: dict, bare: bool) -> float:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(plan))
    rd = tmp / name
    env = dict(os.environ, ULAB_TRAINER_BARE="1" if bare else "0")
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip().splitlines()[-1]}")
    rows = [json.loads(line) for line in (rd / "stage_timings.jsonl").read_text().splitlines()]
    if not bare:
        m = [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]
        ratios = sorted(x["metrics_overhead_s"] / x["step_time_s"] for x in m if x.get("metrics_overhead_s"))
        INSIDE[name.rsplit("_", 1)[0]] = ratios[len(ratios) // 2]
    return sum(r["train_s"] for r in rows)


INSIDE: dict[str, float] = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        data = tmp / "docs.txt"
        data.write_text("\n\n".join(f"document {i} " + "words of text " * (20 + i % 50) for i in range(3000)))
        variants = [("bare", True, False), ("callback", False, False), ("callback + tensor memory", False, True)]
        best = {}
        for r in range(a.repeat):
            for name, bare, mem in variants:
                s = train_seconds(tmp, f"{name.replace(' ', '_').replace('+', '')}_{r}",
                                  make_plan(data, a.steps, a.seq_len, mem), bare)
                best[name] = min(best.get(name, s), s)
        base = best["bare"]
        print(f"SP=2 on CPU, {a.steps} steps, seq_len {a.seq_len}, hidden 256, 4 layers; min of {a.repeat} runs")
        for name, _, _ in variants:
            s = best[name]
            print(f"  {name:26s} {s:8.2f} s  ({s / a.steps * 1000:7.1f} ms/step)  "
                  f"overhead vs bare {100 * (s - base) / base:+6.2f}%")
        print("Time inside the metrics callback (all_gather + JSON line), median share of step time, measured in-run:")
        for k, v in INSIDE.items():
            print(f"  {k:26s} {100 * v:6.3f}%")


if __name__ == "__main__":
    main()
