"""The corpus's step-time misses, term by term, and the readings docs/planner-accuracy.md weighs against them.

    .venv/bin/python bench/time_misses.py

Prints, from the planner and the published values only (nothing is fitted or changed):
- the ALST 8B rows at 32K (A1: 8 GPUs, A7: one GPU with parameters offloaded too, A8: 4 nodes x 8): the planner's
  time breakdown, the parameters each rank and each node steps on the CPU, and the step again when every rank may
  use all of its node's cores (`hardware.cpu_cores_per_node` set past the node's memory-bandwidth cap: what
  DeepSpeed's launcher and a lone torchrun rank give); the H100 window's parameter-offload rows the same way;
- T9 against T1 (the same attention on the same 8 H100s at 1M tokens, T9 the smaller model): the floor one estimate
  that grows with the work has on both, and T9 again at the SDPA flash kernel's efficiency (the FlashAttention-2
  figure on Hopper) instead of cuDNN's;
- the Hugging Face tokens/s rows as the step time each implies (tokens per optimizer step / tokens/s) beside the
  planner's whole-length step.
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import evaluate, read_corpus  # noqa: E402
from bench.corpus_consistency import floor  # noqa: E402
from plan import estimate, validate  # noqa: E402
from plan import throughput as tp  # noqa: E402

# More cores than any node's memory bandwidth can feed: the CPU step runs at the node's cap
# (plan/throughput.py CPU_OPTIMIZER_PARAMS_PER_S), however many ranks share it.
ALL_CORES = 100_000
OFFLOAD_ROWS = ("A1-time", "A7-time", "A8-time", "H100-suite-alst-time", "H100-suite-liger-alst-time",
                "H100-sweep-llama-1b-alst-16384-time")
HF_ROWS = ("HF-1g-sp1-8K-tps", "HF-4g-sp4-8K-tps", "HF-4g-sp4-32K-tps", "HF-4g-sp4-64K-tps")


def _spec(row: dict):
    spec = validate(row["plan"]).spec
    assert spec is not None
    return spec


def _error(row: dict, plan: dict) -> float:
    r = copy.deepcopy(row)
    r["plan"] = plan
    res = evaluate(r)
    assert res.error is not None
    return res.error


def offload_rows(rows: dict[str, dict]) -> None:
    print("== optimizer-offload rows: the planner's terms, and every rank on all its node's cores ==")
    for rid in OFFLOAD_ROWS:
        row = rows[rid]
        spec, th = _spec(row), estimate(row["plan"])["throughput"]
        psi_rank = spec.model.total_params / spec.world
        terms = ", ".join(f"{k} {v:.3g}" for k, v in th["time_breakdown_s"].items() if v >= 0.0005)
        wide = copy.deepcopy(row["plan"])
        wide["hardware"]["cpu_cores_per_node"] = ALL_CORES
        step_wide = estimate(wide)["throughput"]["step_time_s"]
        print(f"  {rid:<38} published {float(row['published']):7.3g} s  planner {th['step_time_s']:7.3g} s "
              f"({_error(row, row['plan']):+.1%})  all cores {step_wide:7.3g} s ({_error(row, wide):+.1%})")
        print(f"    ranks/node {spec.ranks_per_node}, CPU-stepped params per rank {psi_rank:.3g}, per node "
              f"{psi_rank * spec.ranks_per_node:.3g}, offload_params {spec.offload_params}; {terms}")
    a1, a8 = (estimate(rows[i]["plan"])["throughput"]["step_time_s"] for i in ("A1-time", "A8-time"))
    print(f"  A1 - A8: published {float(rows['A1-time']['published']) - float(rows['A8-time']['published']):.3g} s, "
          f"planner {a1 - a8:.3g} s")


def ring_rows(rows: dict[str, dict]) -> None:
    print("\n== T9 against T1 (ring CP 8, 8 x H100, 1,048,576 tokens) ==")
    t1, t9 = rows["T1-time"], rows["T9-time"]
    for row in (t1, t9):
        fl = tp.flops_per_token(_spec(row))
        print(f"  {row['id']}: {row['plan']['model']['preset']:<14} published {row['published']} s; hardware FLOPs "
              f"per token: attention {fl['hw_attention']:.3g}, matmuls {fl['hw_matmul']:.3g}; "
              f"checkpoint_offload {row['plan']['training']['checkpoint_offload']}")
    x = floor(float(t1["published"]), float(t9["published"]), 0.0)
    print(f"  the best one estimate that grows with the work can do on both: worst error {x:.1%}")
    key = ("sdpa", "hopper")
    cudnn = tp.ATTN_EFFICIENCY[key]
    try:
        for eff in (cudnn, tp.ATTN_EFFICIENCY[("flash_attention_2", "hopper")]):
            tp.ATTN_EFFICIENCY[key] = eff
            print(f"  attention at {eff:.2f} of peak: T1 {evaluate(t1).error:+.1%}, T9 {evaluate(t9).error:+.1%}")
    finally:
        tp.ATTN_EFFICIENCY[key] = cudnn


def hf_rows(rows: dict[str, dict]) -> None:
    print("\n== Hugging Face tokens/s rows: the step each figure implies ==")
    for rid in HF_ROWS:
        row = rows[rid]
        spec = _spec(row)
        tokens = spec.seq_len * spec.sequences_per_step
        implied = tokens / float(row["published"])
        step = estimate(row["plan"])["throughput"]["step_time_s"]
        print(f"  {rid:<20} {tokens:>7,} tokens per step at {float(row['published']):>6,.0f} tokens/s: "
              f"{implied:5.1f} s per step; planner, whole-length documents: {step:5.1f} s")


def main() -> int:
    rows = {r["id"]: r for r in read_corpus()}
    offload_rows(rows)
    ring_rows(rows)
    hf_rows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
