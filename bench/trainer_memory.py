"""Measured memory of the Ulysses trainer on CPU (torch's MemTracker: bytes of live tensor storages per rank).

1. SP scaling: the same model and seq_len trained by one process and by SP=2; per-rank peak activation memory
   (activations + temporaries at the step's peak, i.e. the peak minus parameters, gradients, optimizer states).
2. Tiled logits loss: a large vocabulary, plain loss (full [seq, vocab] logits) vs DeepSpeed's TiledFusedLogitsLoss.
3. TiledMLP: plain MLP vs DeepSpeed's TiledMLP at the same seq_len.

Each row is a real `ulab train` run (2 steps; the figure is step 2). Prints figures; asserts nothing.
Usage: .venv/bin/python bench/trainer_memory.py [--seq-len 4096]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ULAB = Path(sys.executable).parent / "ulab"


def plan(data: Path, *, sp: int, seq_len: int, vocab: int = 512, hidden: int = 64, inter: int = 256,
         tiled_logits: bool = False, tiled_mlp: bool = False) -> dict:
    return {
        "model": {"config": {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": inter,
                             "vocab_size": vocab, "max_position_embeddings": max(2048, seq_len)}},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp, "num_nodes": 1},
        "parallel": {"sp_size": sp, "dp_size": 1},
        "training": {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "tiled_logits_loss": tiled_logits, "tiled_mlp": tiled_mlp, "attn_implementation": "sdpa"},
        "run": {"steps": 2, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None},
    }


def run(tmp: Path, name: str, p: dict) -> dict:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(p))
    rd = tmp / name
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip().splitlines()[-1]}")
    return [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()][-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32768)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        data = tmp / "one_document.txt"  # one long document: plain causal attention, no packing mask
        data.write_text(" ".join(f"token{i % 997}" for i in range(a.seq_len * 2)))
        L = a.seq_len
        one = run(tmp, "sp1", plan(data, sp=1, seq_len=L))
        two = run(tmp, "sp2", plan(data, sp=2, seq_len=L))
        a1, a2 = one["peak_activations_gib"][0], max(two["peak_activations_gib"])
        print(f"SP scaling at seq_len {L} (hidden 64, 2 layers, 4 heads), measure: {one['memory_measure']}")
        print(f"  one process : peak activations {a1 * 1024:8.2f} MiB, "
              f"peak allocated {one['peak_allocated_gib'][0] * 1024:8.2f} MiB")
        print(f"  SP=2 per rank: peak activations {a2 * 1024:8.2f} MiB, "
              f"peak allocated {max(two['peak_allocated_gib']) * 1024:8.2f} MiB")
        print(f"  ratio SP=2 / one process (activations): {a2 / a1:.3f}   (target <= 0.6)")
        plain = run(tmp, "logits_plain", plan(data, sp=1, seq_len=L // 2, vocab=a.vocab))
        tiled = run(tmp, "logits_tiled", plan(data, sp=1, seq_len=L // 2, vocab=a.vocab, tiled_logits=True))
        p, q = plain["peak_allocated_gib"][0], tiled["peak_allocated_gib"][0]
        print(f"Tiled logits loss at seq_len {L // 2}, vocab {a.vocab}:")
        print(f"  plain loss: peak allocated {p * 1024:8.2f} MiB "
              f"(activations {plain['peak_activations_gib'][0] * 1024:.2f})")
        print(f"  tiled loss: peak allocated {q * 1024:8.2f} MiB "
              f"(activations {tiled['peak_activations_gib'][0] * 1024:.2f})")
        print(f"  ratio tiled / plain: {q / p:.3f};  loss plain {plain['loss']:.6f} vs tiled {tiled['loss']:.6f}")
        big = dict(hidden=64, inter=2048)
        mlp = run(tmp, "mlp_plain", plan(data, sp=1, seq_len=L, **big))
        tmlp = run(tmp, "mlp_tiled", plan(data, sp=1, seq_len=L, tiled_mlp=True, **big))
        m, n = mlp["peak_activations_gib"][0], tmlp["peak_activations_gib"][0]
        print(f"TiledMLP at seq_len {L}, intermediate 2048:")
        print(f"  plain MLP: peak activations {m * 1024:8.2f} MiB;  TiledMLP: {n * 1024:8.2f} MiB;  ratio {n / m:.3f}")
        print(f"  loss plain {mlp['loss']:.6f} vs tiled {tmlp['loss']:.6f}")


if __name__ == "__main__":
    main()
