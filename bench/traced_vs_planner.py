"""The planner's activation terms against a FakeTensor trace of the real model, feature by feature (ALST's ablation).

    .venv/bin/python bench/traced_vs_planner.py [--layers 32] [--tokens 32768,65536,131072,262144] [--markdown]

Llama-3.1-8B's layer shape (hidden 4096, 32 heads, 8 kv heads, MLP 14336, vocab 128256) at the given depth, one rank
holding `tokens` tokens (with Ulysses SP 8: seq_len = 8 x tokens, the attention runs over all of them on 4 heads).
The features are added as ALST's Table 1 adds them: Liger's kernels with the fused linear cross-entropy, Ulysses SP
over 8 ranks (the emulated all-to-all's copies), DeepSpeed's TiledMLP, checkpoint offload. For each the trace
(plan.traced: torch's MemTracker under FakeTensorMode, on CPU) gives the peak of everything that is not a model
state; the planner gives the same peak (plan.traced.analytical_activation_peak) and its terms at that peak phase:
the checkpoints or saved activations, one layer's backward on top, the logits/loss, the all-to-all buffers.
`step` is what adding the feature changed, traced and planned. No planner constant is fitted to this table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plan.memory import GIB, estimate_memory  # noqa: E402
from plan.traced import config_for_plan, trace_peak_bytes  # noqa: E402
from plan.validation import validate  # noqa: E402

LLAMA_31_8B = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
               "rope_theta": 500000.0}
# ALST Table 1's order: each feature is added to the ones before it.
FEATURES = (("baseline", {}, 1),
            ("+ liger (fused loss)", {"liger_kernel": True}, 1),
            ("+ ulysses sp 8", {"liger_kernel": True}, 8),
            ("+ tiled mlp", {"liger_kernel": True, "tiled_mlp": True}, 8),
            ("+ checkpoint offload", {"liger_kernel": True, "tiled_mlp": True, "checkpoint_offload": True}, 8))


def plan_for(layers: int, tokens: int, training: dict, sp: int) -> dict:
    return {"model": {"config": {**LLAMA_31_8B, "num_hidden_layers": layers}},
            "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 1, "cpu_memory_gib_per_node": 1900},
            "parallel": {"sp_size": sp, "dp_size": 8 // sp},
            "training": {"seq_len": tokens * sp, "micro_batch_size": 1, "grad_accum": 1, "dtype": "bf16",
                         "zero_stage": 3, "offload_optimizer": True, "activation_checkpointing": True,
                         "attn_implementation": "sdpa", **training}}


def row(layers: int, tokens: int, name: str, training: dict, sp: int) -> dict:
    spec = validate(plan_for(layers, tokens, training, sp)).spec
    assert spec is not None
    t0 = time.perf_counter()
    traced = trace_peak_bytes(spec, config_for_plan(spec))
    phases = estimate_memory(spec)["activation_phases"]
    phase = max(phases, key=lambda p: sum(phases[p].values()))
    terms = phases[phase]
    return {"feature": name, "tokens": tokens, "traced": traced["activation_peak"] / GIB,
            "traced_saved": traced["categories"].get("Activation", 0) / GIB,
            "traced_temp": traced["categories"].get("Temp", 0) / GIB,
            "planned": sum(terms.values()) / GIB, "phase": phase,
            **{k: v / GIB for k, v in terms.items()}, "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--tokens", default="32768,65536,131072,262144", help="tokens per rank, comma-separated")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    print(f"Llama-3.1-8B layer shape, {args.layers} layers, ZeRO-3, activation checkpointing; GiB per rank "
          "(activations + logits/loss + all-to-all buffers; model states left out)\n")
    if args.markdown:
        print("| tokens per rank | features | traced (saved + temp) | planned (phase) | planned terms: "
              "activations / logits+loss / all-to-all | planned / traced | step traced | step planned |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tokens in (int(x) for x in args.tokens.split(",")):
        before = None
        for name, training, sp in FEATURES:
            r = row(args.layers, tokens, name, training, sp)
            step_t = "-" if before is None else f"{r['traced'] - before['traced']:+.2f}"
            step_p = "-" if before is None else f"{r['planned'] - before['planned']:+.2f}"
            ratio = r["planned"] / r["traced"] if r["traced"] else float("nan")
            terms = f"{r['activations']:.2f} / {r['logits_and_loss']:.2f} / {r['comm_buffers']:.2f}"
            if args.markdown:
                print(f"| {tokens:,} | {name} | {r['traced']:.2f} ({r['traced_saved']:.2f} + {r['traced_temp']:.2f}) "
                      f"| {r['planned']:.2f} ({r['phase']}) | {terms} | {ratio:.2f} | {step_t} | {step_p} |")
            else:
                print(f"{tokens:>8,} {name:<22} traced {r['traced']:7.2f} (saved {r['traced_saved']:6.2f} + temp "
                      f"{r['traced_temp']:6.2f})  planned {r['planned']:7.2f} [{r['phase']}: {terms}]  "
                      f"planned/traced {ratio:.2f}  step {step_t} vs {step_p}  ({r['seconds']:.0f} s)", flush=True)
            before = r
    return 0


if __name__ == "__main__":
    sys.exit(main())
