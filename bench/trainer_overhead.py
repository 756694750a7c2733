"""Our trainer's per-step cost against a bare loop of the same training, on 2 CPU ranks (SP=2, ZeRO-2, fp32).

Five variants of one plan, run alternated (`--repeat` rounds; the minimum per variant is kept: the machine is
shared), each on the same packed data:
  ulab train               the trainer as users run it: Trainer + metrics callback + CPU tensor-memory tracker on
                           the stage's first 2 steps and every run.memory_every-th (default 10: steps 1, 2, 10, 20)
  ulab train, mem. every step  run.memory_every: 1 (before: the tracker on every step)
  ulab train, no memory    run.track_memory: false (the callback still gathers and writes every step)
  ulab train, no callback  ULAB_TRAINER_BARE=1: the Trainer loop without our callback
  bare loop                bench/bare_loop.py: Accelerate + DeepSpeed + UlyssesSPAttentionHF, no Trainer, no
                           callbacks (the same model, data, DeepSpeed config, optimizer, schedule and loss)
Per step: the seconds after the end of step 1 / (steps - 1) (stage_timings.jsonl `after_first_step_s`; bare.json's
step times from step 2 on): the Trainer builds the DeepSpeed engine inside `train()` and the bare loop before its
timer, so whole train seconds would charge that set-up (20 s on a loaded machine) to the Trainer's steps; both are
printed. The differences between adjacent
variants say where our extra time goes (memory tracking; the callback's all_gather, system sample and JSON line;
the Trainer itself), and the runs' own measures split the callback further: `metrics_overhead_s` (time inside the
callback, all_gather included) and the token all_reduce (timed in the bare loop: the Trainer does the same one).
The losses of `ulab train` and the bare loop are compared step by step (they must be identical). The trainer's
own measured breakdown (forward_s, backward_s, optimizer_s of its metrics records) is printed beside it.
Prints figures; asserts nothing. Usage: .venv/bin/python bench/trainer_overhead.py [--steps 20] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ULAB = Path(sys.executable).parent / "ulab"
TORCHRUN = Path(sys.executable).parent / "torchrun"


def make_plan(data: Path, steps: int, seq_len: int, track_memory: bool, memory_every: int = 10) -> dict:
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
                "track_memory": track_memory, "memory_every": memory_every, "checkpoint_every": 0},
    }


def ulab_train(tmp: Path, name: str, plan: dict, bare: bool) -> dict:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(plan))
    rd = tmp / name
    env = dict(os.environ, ULAB_TRAINER_BARE="1" if bare else "0", ULAB_TRAINER_SKIP_FINAL_SAVE="1",
               PYTHONPATH=str(ROOT))  # the tree this script lies in is the one measured (a copy at another commit)
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip().splitlines()[-1]}")
    timing = [json.loads(x) for x in (rd / "stage_timings.jsonl").read_text().splitlines()]
    out = {"train_s": sum(r["train_s"] for r in timing), "data": rd / "data",
           "after_first_s": sum(r["after_first_step_s"] for r in timing)}
    if not bare:
        m = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()]
        out["losses"] = [x["loss"] for x in m]
        out["inside_callback_s"] = statistics.median(x["metrics_overhead_s"] for x in m if x.get("metrics_overhead_s"))
        out["phases"] = {k: statistics.median(x[k] for x in m) for k in ("forward_s", "backward_s", "optimizer_s",
                                                                          "step_time_s")}
        out["memory_steps"] = sorted({x["memory_step"] for x in m if x.get("memory_step") is not None})
    return out


def bare_loop(tmp: Path, name: str, plan: dict, data: Path) -> dict:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(plan))
    rd = tmp / name
    rd.mkdir()
    shutil.copytree(data, rd / "data")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "--standalone", str(ROOT / "bench" / "bare_loop.py"),
                           "--plan", str(pf), "--run-dir", str(rd)], env=env, capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads((rd / "bare.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        docs = tmp / "docs.txt"
        docs.write_text("\n\n".join(f"document {i} " + "words of text " * (20 + i % 50) for i in range(3000)))
        full, nomem = make_plan(docs, a.steps, a.seq_len, True), make_plan(docs, a.steps, a.seq_len, False)
        every = make_plan(docs, a.steps, a.seq_len, True, memory_every=1)
        best: dict[str, float] = {}  # per step after step 1
        whole: dict[str, float] = {}  # train seconds / steps (the Trainer's engine set-up included)
        seen: dict[str, dict] = {}
        variants = {"ulab train": ("full", full, False), "ulab train, mem. every step": ("every", every, False),
                    "ulab train, no memory": ("nomem", nomem, False),
                    "ulab train, no callback": ("nocb", nomem, True)}
        for r in range(a.repeat):
            for name in (list(variants) if r % 2 == 0 else list(reversed(variants))):
                prefix, plan, no_callback = variants[name]
                seen[name] = ulab_train(tmp, f"{prefix}_{r}", plan, no_callback)
                best[name] = min(best.get(name, 1e9), seen[name]["after_first_s"] / (a.steps - 1))
            seen["bare loop"] = bare_loop(tmp, f"bare_{r}", nomem, seen["ulab train"]["data"])
            seen["bare loop"]["after_first_s"] = sum(seen["bare loop"]["step_times"][1:])
            best["bare loop"] = min(best.get("bare loop", 1e9), seen["bare loop"]["after_first_s"] / (a.steps - 1))
            for name in (*variants, "bare loop"):
                whole[name] = min(whole.get(name, 1e9), seen[name]["train_s"] / a.steps)
            for prefix, _, _ in variants.values():
                shutil.rmtree(tmp / f"{prefix}_{r}", ignore_errors=True)
        base = best["bare loop"]
        print(f"SP=2 ZeRO-2 on 2 CPU ranks, fp32, {a.steps} steps, seq_len {a.seq_len}, hidden 256, 4 layers; "
              f"per step after step 1 (whole train seconds / steps beside it): min of {a.repeat} alternated rounds")
        for name in ("ulab train, mem. every step", "ulab train", "ulab train, no memory", "ulab train, no callback",
                     "bare loop"):
            print(f"  {name:28s} {best[name] * 1000:8.1f} ms/step   {best[name] / base:5.2f}x the bare loop"
                  f"   (whole: {whole[name] * 1000:7.1f} ms/step, {whole[name] / whole['bare loop']:5.2f}x)")
        print(f"ratio before (memory every step) {best['ulab train, mem. every step'] / base:.2f}x, after (memory on "
              f"steps {seen['ulab train']['memory_steps']}) {best['ulab train'] / base:.2f}x")
        print("where the difference goes (ms/step, from adjacent variants):")
        print(f"  CPU tensor-memory tracking  {1000 * (best['ulab train'] - best['ulab train, no memory']):+8.1f}"
              f"   (every step: {1000 * (best['ulab train, mem. every step'] - best['ulab train, no memory']):+.1f})")
        callback = best["ulab train, no memory"] - best["ulab train, no callback"]
        print(f"  metrics callback            {1000 * callback:+8.1f}"
              f"   (measured inside it: {1000 * seen['ulab train, no memory']['inside_callback_s']:.1f} ms median:"
              " all_gather, system sample, JSON line)")
        print(f"  the Trainer itself          {1000 * (best['ulab train, no callback'] - base):+8.1f}")
        print(f"  token all_reduce            {1000 * seen['bare loop']['token_all_reduce_s'] / a.steps:8.1f}"
              "   (in both loops; timed in the bare one)")
        ph = seen["ulab train"]["phases"]
        print("the trainer's own breakdown (medians of its records, slowest rank): "
              + ", ".join(f"{k} {1000 * v:.1f} ms" for k, v in ph.items()))
        ours, bare = seen["ulab train"]["losses"], seen["bare loop"]["losses"]
        worst = max(abs(x - y) for x, y in zip(ours, bare))
        print(f"losses, ulab train vs bare loop: {len(ours)} vs {len(bare)} steps, largest difference {worst:.3g} "
              f"({'identical' if worst == 0 else 'NOT identical'}); first {ours[:3]} / {bare[:3]}")


if __name__ == "__main__":
    main()
