"""The trainer's step losses against another checkout's, on CPU ranks: the same plan and packed-document data, in the
layouts sp 1, sp 2 and sp 2 x dp 2. A change to the hot path (attention over packed documents, tiling, the step
loop) must leave every step's loss where it was; this prints, per layout, each tree's losses and the largest relative
difference.

    git archive <commit> | tar -x -C /tmp/before
    .venv/bin/python bench/trainer_losses.py --against /tmp/before [--steps 6] [--seq-len 512]

Each tree runs with PYTHONPATH set to it (this venv's packages). Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ULAB = Path(sys.executable).parent / "ulab"
LAYOUTS = ((1, 1), (2, 1), (2, 2))  # (sp, dp)


def make_plan(data: Path, steps: int, seq_len: int, sp: int, dp: int) -> dict:
    return {
        "model": {"config": {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                             "vocab_size": 512, "max_position_embeddings": 4096}},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp * dp, "num_nodes": 1},
        "parallel": {"sp_size": sp, "dp_size": dp},
        "training": {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "activation_checkpointing": True, "attn_implementation": "sdpa"},
        "run": {"steps": steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None,
                "checkpoint_every": 0, "track_memory": False},
    }


def losses(tree: Path, tmp: Path, name: str, plan: dict) -> list[float]:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(plan))
    rd = tmp / name
    env = dict(os.environ, PYTHONPATH=str(tree), ULAB_TRAINER_SKIP_FINAL_SAVE="1")
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], env=env, cwd=tree,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip()[-2000:]}")
    records = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if "loss" in r and "tokens" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, required=True, help="another checkout of this repository")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq-len", type=int, default=512)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        docs = tmp / "docs.txt"  # documents of 40 to 1,100 bytes: packed rows of several documents each
        docs.write_text("\n\n".join(f"document {i} " + "words of text " * (3 + (i * 37) % 80) for i in range(600)))
        print(f"{'layout':<9} | {'step losses (this tree)':<60} | max rel. diff")
        for sp, dp in LAYOUTS:
            plan = make_plan(docs, a.steps, a.seq_len, sp, dp)
            ours = losses(ROOT, tmp, f"ours-sp{sp}-dp{dp}", plan)
            theirs = losses(a.against.resolve(), tmp, f"against-sp{sp}-dp{dp}", plan)
            worst = max(abs(x - y) / abs(y) for x, y in zip(ours, theirs, strict=True))
            shown = " ".join(f"{x:.6f}" for x in ours)
            print(f"sp{sp} x dp{dp} | {shown:<60} | {worst:.1e}")


if __name__ == "__main__":
    main()
