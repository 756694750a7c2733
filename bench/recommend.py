"""Recommend: the top 3 configurations for practitioners' scenarios, and the time per call (target: at most 200 ms
for 64 GPUs; the search prunes, it does not enumerate).

    .venv/bin/python bench/recommend.py [--repeat N]

Every figure is the planner's estimate (H100/H200 datasheet figures, no GPU measurement).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.planner_speed import timeit
from plan import fix, recommend

TARGET_MS_64 = 200


def hw(gpu: str, per_node: int, nodes: int, cpu: float = 1900) -> dict:
    return {"gpu": gpu, "gpus_per_node": per_node, "num_nodes": nodes, "cpu_memory_gib_per_node": cpu}


LLAMA8B, QWEN4B, LLAMA70B, QWEN32B = ({"preset": p} for p in (
    "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-4B", "meta-llama/Llama-3.1-70B", "Qwen/Qwen3-32B"))
SCENARIOS = [
    ("the guide: Llama-3.1-8B at 512K on 32 x H100", LLAMA8B, hw("H100-80GB", 8, 4), 524288, False),
    ("Qwen3-4B at 128K on 4 x H100 (the HF blog's OOM row)", QWEN4B, hw("H100-80GB", 4, 1), 131072, False),
    ("Llama-3.1-8B at 1M on 8 x H100", LLAMA8B, hw("H100-80GB", 8, 1), 1 << 20, False),
    ("Llama-3.1-8B at 256K on 1 x H200", LLAMA8B, hw("H200-141GB", 1, 1), 262144, False),
    ("Qwen3-32B at 256K on 16 x H100", QWEN32B, hw("H100-80GB", 8, 2), 262144, False),
    ("Llama-3.1-70B at 128K on 64 x H100", LLAMA70B, hw("H100-80GB", 8, 8), 131072, False),
    ("Llama-3.1-8B, longest on 64 x H100", LLAMA8B, hw("H100-80GB", 8, 8), 131072, True),
    ("Llama-3.1-8B at 4M on 64 x H200", LLAMA8B, hw("H200-141GB", 8, 8), 4 << 20, False),
]


def summary(p: dict) -> str:
    t = p["training"]
    on = [k for k in ("liger_kernel", "tiled_logits_loss", "activation_checkpointing", "checkpoint_offload",
                      "tiled_mlp", "offload_optimizer", "offload_params") if t[k]]
    short = {"liger_kernel": "liger", "tiled_logits_loss": "tiled-loss", "activation_checkpointing": "ckpt",
             "checkpoint_offload": "ckpt-offload", "tiled_mlp": "tiled-mlp", "offload_optimizer": "off-opt",
             "offload_params": "off-params"}
    return (f"sp{p['parallel']['sp_size']} dp{p['parallel']['dp_size']} z{t['zero_stage']} "
            f"{t['attn_implementation'].replace('flash_attention_', 'fa')} mb{t['micro_batch_size']} "
            + "+".join(short[k] for k in on))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    worst_64 = 0.0
    for name, model, hardware, seq, longest in SCENARIOS:
        plan = {"model": model, "hardware": hardware, "training": {"seq_len": seq}}
        ms = timeit(lambda plan=plan, longest=longest: recommend(plan, longest=longest), args.repeat)
        med = statistics.median(ms)
        gpus = hardware["gpus_per_node"] * hardware["num_nodes"]
        if gpus == 64:
            worst_64 = max(worst_64, med)
        r = recommend(plan, longest=longest)
        print(f"\n== {name}{' (longest)' if longest else ''}: {med:.1f} ms per call (median of {len(ms)}), "
              f"{gpus} GPUs ==")
        if not r["recommendations"]:
            print("  nothing fits; nearest: " + "; ".join(x["why"] for x in r["rejected"][:2]))
        for i, x in enumerate(r["recommendations"][:3], 1):
            m, t = x["estimate"]["memory"], x["estimate"]["throughput"]
            print(f"  {i}. {summary(x['plan']):<62} seq {x['plan']['training']['seq_len']:>9,}  "
                  f"{t['tokens_per_s']:>9,.0f} tok/s  {m['device_total_gib']:5.1f}/{m['gpu_capacity_gib']:.0f} GiB")
            print(f"     {'; '.join(x['reasons'][:3])}")
        if r["rejected"]:
            print(f"  nearest rejected: {summary(r['rejected'][0]['plan'])}: {r['rejected'][0]['why']}")
    oom = {"model": LLAMA8B, "hardware": hw("H100-80GB", 8, 1), "parallel": {"sp_size": 4, "dp_size": 2},
           "training": {"seq_len": 262144}}
    ms = timeit(lambda: fix(oom), args.repeat)
    f = fix(oom)
    print(f"\n== fix: Llama-3.1-8B OOM at 262,144 with Ulysses degree 4 on 8 x H100: {statistics.median(ms):.1f} ms ==")
    print("  " + ", ".join(f"{c['field']} {c['from']} -> {c['to']}" for c in f["changes"]) + f"; {f['cost']}")
    print(f"\nrecommend for 64 GPUs: worst median {worst_64:.1f} ms per call, target <= {TARGET_MS_64} ms: "
          f"{'OK' if worst_64 <= TARGET_MS_64 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
