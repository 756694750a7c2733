"""Planner accuracy against the published Qwen3-4B / H100 figures of the HF Ulysses SP blog.

    .venv/bin/python bench/planner_accuracy.py [--csv PATH]

Prints every row of ../shared/reference/published_hf_blog_qwen3_4b.csv: predicted vs published peak memory and
tokens/s, the error, and the worst error last. Targets (issue 3): memory within 10% on every row with a figure,
the 128K row predicted not to fit on 80 GB, tokens/s within 25%.

Which memory figure is compared: the blog's "peak_gb" is read as torch.cuda.max_memory_allocated() in GiB, i.e. our
`peak_allocated_gib`. Reasons: HF/DeepSpeed memory reports (DeepSpeed `see_memory_usage` "Max_MA", the HF blog's
own tables) divide by 2**30 and label the result GB, and the OOM row's "needs about 81 GB" is an allocation-size
figure from the CUDA OOM message, which reports allocated bytes, not what nvidia-smi shows. `device_total_gib`
(allocated + cache, context, NCCL; what `fits` uses) is printed beside it.

The model is run twice: (A) the configuration the CSV states (optimizer offloaded to CPU), and (B) the same with
the optimizer states on the GPU, as a diagnostic. No number in the planner is fitted per row. Then the planner's
max context against the ALST paper, whether any missing memory term could close the gap on the blog rows without
breaking ALST, and bounds on the blog's step times that need no efficiency figure.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.planner import estimate, max_seq_len  # noqa: E402
from backend.planner.throughput import CPU_OPTIMIZER_PARAMS_PER_S  # noqa: E402

DEFAULT_CSV = ROOT.parent / "shared" / "reference" / "published_hf_blog_qwen3_4b.csv"


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#") and line.strip()))


def plan_for(row: dict, offload_optimizer: bool) -> dict:
    gpus = int(row["gpus"])
    return {"model": {"preset": "Qwen/Qwen3-4B"},
            "hardware": {"gpu": "H100-80GB", "gpus_per_node": gpus, "num_nodes": 1, "cpu_memory_gib_per_node": 1900},
            "parallel": {"sp_size": int(row["sp_size"]), "dp_size": int(row["dp_size"])},
            "training": {"seq_len": int(row["seq_len"]), "micro_batch_size": 1, "grad_accum": 8, "dtype": "bf16",
                         "zero_stage": 3, "offload_optimizer": offload_optimizer, "offload_params": False,
                         "activation_checkpointing": True, "checkpoint_offload": False, "tiled_mlp": False,
                         "tiled_logits_loss": False, "attn_implementation": "flash_attention_2"}}


def num(x: str):
    return float(x) if x not in ("", None) else None


def sp_rows_with_memory(rows: list[dict]) -> list[dict]:
    """The Ulysses rows (sp_size > 1) that publish a memory figure."""
    return [r for r in rows if r["sp_size"] != "1" and r["peak_gb"]]


def err(pred: float, pub):
    return None if pub is None else (pred - pub) / pub


def fmt_err(e):
    return "    -  " if e is None else f"{e * 100:+6.1f}%"


def _solve3(m: list[list[float]], y: list[float]) -> list[float]:
    """Solve a 3x3 linear system by Cramer's rule (no numpy needed for three unknowns)."""
    def det(a):
        return (a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
                + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0]))
    d = det(m)
    return [det([row[:i] + [y[k]] + row[i + 1:] for k, row in enumerate(m)]) / d for i in range(3)]


def run(rows: list[dict], offload: bool, label: str) -> dict:
    print(f"\n== ({label}) optimizer offload = {offload} ==")
    print(f"{'gpus':>4} {'sp':>3} {'dp':>3} {'seq':>7} | {'pred GiB':>8} {'dev tot':>7} {'fits':>5} | "
          f"{'pub':>5} {'err':>7} {'pub2':>5} {'err2':>7} | {'pred tok/s':>10} {'pub':>6} {'err':>7} "
          f"{'pub2':>6} {'err2':>7} | outcome")
    mem_errs, tok_errs, oom_ok = [], [], []
    for r in rows:
        e = estimate(plan_for(r, offload))
        m, t = e["memory"], e["throughput"]
        pred, tok = m["peak_allocated_gib"], t["tokens_per_s"]
        p1, p2 = num(r["peak_gb"]), num(r["peak_gb_other_revision"])
        t1, t2 = num(r["tokens_per_s"]), num(r["tokens_per_s_other_revision"])
        em1, em2, et1, et2 = err(pred, p1), err(pred, p2), err(tok, t1), err(tok, t2)
        where = f"{r['gpus']}x sp{r['sp_size']} dp{r['dp_size']} {int(r['seq_len']) // 1024}K"
        for name, e_ in (("memory", em1), ("memory (other revision)", em2)):
            if e_ is not None:
                mem_errs.append((abs(e_), e_, f"{name} {where}"))
        for name, e_ in (("tokens/s", et1), ("tokens/s (other revision)", et2)):
            if e_ is not None:
                tok_errs.append((abs(e_), e_, f"{name} {where}"))
        if r["outcome"].startswith("oom"):
            oom_ok.append(not m["fits"])
        print(f"{r['gpus']:>4} {r['sp_size']:>3} {r['dp_size']:>3} {r['seq_len']:>7} | {pred:8.2f} "
              f"{m['device_total_gib']:7.2f} {str(m['fits']):>5} | {p1 or '-':>5} {fmt_err(em1)} {p2 or '-':>5} "
              f"{fmt_err(em2)} | {tok:10.0f} {int(t1) if t1 else '-':>6} {fmt_err(et1)} {int(t2) if t2 else '-':>6} "
              f"{fmt_err(et2)} | {r['outcome']}")
    worst_m = max(mem_errs)
    worst_t = max(tok_errs)
    within_m = sum(1 for a, _, _ in mem_errs if a <= 0.10)
    within_t = sum(1 for a, _, _ in tok_errs if a <= 0.25)
    print(f"memory within 10%: {within_m}/{len(mem_errs)} figures; worst {worst_m[1] * 100:+.1f}% ({worst_m[2]})")
    print(f"128K row predicted not to fit on 80 GB: {all(oom_ok) and bool(oom_ok)}")
    print(f"tokens/s within 25%: {within_t}/{len(tok_errs)} figures; worst {worst_t[1] * 100:+.1f}% ({worst_t[2]})")
    return {"worst_mem": worst_m, "worst_tok": worst_t}


def alst() -> None:
    """Max context against the ALST paper's headline figures (a second, independent published source)."""
    from tests.plans import ALST_BASELINE, ALST_PUBLISHED, alst_plan
    print("\n== ALST paper (arXiv:2506.13996): Llama-3.1-8B, H100-80GB, ZeRO-3, optimizer offload, max context ==")
    print(f"{'gpus':>4} | {'ALST (SP + tiling + ckpt offload)':>33} | {'baseline (DP, none of them)':>28}")
    for (per_node, nodes), pub in ALST_PUBLISHED.items():
        got = max_seq_len(alst_plan(per_node, nodes))["max_seq_len"]
        base = max_seq_len(alst_plan(per_node, nodes, alst=False))["max_seq_len"]
        print(f"{per_node * nodes:>4} | {got:>10,} vs {pub:>10,} {fmt_err(err(got, pub))} | "
              f"{base:>8,} vs {ALST_BASELINE:,} {fmt_err(err(base, ALST_BASELINE))}")


def missing_term_vs_alst(rows: list[dict]) -> None:
    """Whether any memory term the planner lacks could explain the blog's offloaded SP rows without breaking ALST.

    The SP rows sit a near-constant amount above the planner's prediction for the stated (offloaded) configuration.
    Take that offset as a missing term of each form a term can have - a constant per GPU, bytes per parameter on
    every GPU, or bytes per parameter sharded over the ZeRO group - size it on the Qwen3-4B rows, add it to the
    ALST Llama-8B configuration, and search the max context again (same fit rule as the planner: device total
    with the term, allocator share included, within capacity; host memory within the node's)."""
    from backend.planner.estimator import memory_section
    from backend.planner.memory import ALLOCATOR_FRAGMENTATION, GIB, estimate_memory
    from backend.planner.validate import parse
    from tests.plans import ALST_PUBLISHED, alst_plan

    sp_rows = sp_rows_with_memory(rows)
    offsets = [num(r["peak_gb"]) - estimate(plan_for(r, True))["memory"]["peak_allocated_gib"] for r in sp_rows]
    off_gib = sum(offsets) / len(offsets)
    qwen = parse(plan_for(sp_rows[0], True))[0]
    forms = {"constant per GPU": lambda s: off_gib * GIB,
             "bytes/param on every GPU": lambda s: off_gib * GIB / qwen.model.total_params * s.model.total_params,
             "bytes/param over the ZeRO group": lambda s: off_gib * GIB * qwen.world / qwen.model.total_params
             * s.model.total_params / s.world}
    print(f"\n== A missing term? The offloaded SP rows sit {min(offsets):.1f}-{max(offsets):.1f} GiB above the prediction "
          f"(mean {off_gib:.1f}) ==")
    print("  as this term, sized on Qwen3-4B sp4, the ALST max context becomes (published 500K / 3.7M / 15M):")

    def fits_with(spec, extra: float) -> bool:
        sec = memory_section(spec, estimate_memory(spec))
        return sec["device_total_gib"] + extra * (1 + ALLOCATOR_FRAGMENTATION) / GIB <= sec["gpu_capacity_gib"] \
            and sec["cpu_fits"]

    holds = []
    for name, term in forms.items():
        cells, errs = [], []
        for (per_node, nodes), pub in ALST_PUBLISHED.items():
            spec = parse(alst_plan(per_node, nodes))[0]
            extra, sp = term(spec), spec.sp
            lo, hi = 0, max_seq_len(alst_plan(per_node, nodes))["max_seq_len"] // sp
            while hi - lo > 1:                   # the term only removes room: the answer is below the planner's
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits_with(spec.with_(seq_len=mid * sp), extra) else (lo, mid)
            got = lo * sp if fits_with(spec.with_(seq_len=max(lo, 1) * sp), extra) else 0
            cells.append(f"{got:>10,} {fmt_err(err(got, pub))} (+{extra / GIB:5.1f} GiB)")
            errs.append(abs(err(got, pub)))
        print(f"  {name:>32}: " + " | ".join(cells))
        if max(errs) <= 0.10:
            holds.append(name)
    if holds:
        print(f"  Kept within 10% of every ALST figure by: {', '.join(holds)}.")
    else:
        print("  No form keeps every ALST figure within 10%: the offset is not a term the planner lacks for this\n"
              "  configuration; the blog rows and ALST cannot both be the offloaded configuration's memory.")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=DEFAULT_CSV)
    args = ap.parse_args()
    rows = read_rows(args.csv)
    print(f"published: {args.csv}")
    print("memory compared: predicted peak_allocated_gib (GiB) vs the blog's peak_gb read as max_memory_allocated "
          "in GiB; 'dev tot' is allocated + allocator cache + CUDA context + NCCL (what `fits` uses).")
    print(f"one global calibration constant: CPU optimizer {CPU_OPTIMIZER_PARAMS_PER_S / 1e9:.2f}e9 params/s per node")
    a = run(rows, True, "A: as the CSV states")
    b = run(rows, False, "B: diagnostic, optimizer states on the GPU")
    alst()
    missing_term_vs_alst(rows)
    print("\nReading:")
    sp_rows = sp_rows_with_memory(rows)
    for label, off in (("A", True), ("B", False)):
        errs = [abs(err(estimate(plan_for(r, off))["memory"]["peak_allocated_gib"], num(r["peak_gb"])))
                for r in sp_rows]
        print(f"  ({label}) SP rows with a memory figure: worst |error| {max(errs) * 100:.1f}%")
    print("  The SP rows' intercept (memory at zero tokens) matches ZeRO-3 with the Adam states (12 B/param) and the")
    print("  fp32 gradient sub-group buffer on the GPU, which an offloaded optimizer does not keep there; the sp1/dp4")
    print("  row does not. The two readings cannot both hold for one configuration; the planner models the stated one.")
    # Rows that hold the same tokens per rank on the same number of ZeRO-3 shards: every per-rank tensor has the
    # same size (Ulysses' attention sees seq with heads/sp, i.e. the same element count) except the all-to-all
    # buffers, so the physics gives them nearly the same memory, whatever the model.
    same: dict[tuple, list] = {}
    for r in rows:
        if r["peak_gb"]:
            same.setdefault((int(r["seq_len"]) // int(r["sp_size"]), int(r["gpus"])), []).append(r)
    for (local, gpus), group in same.items():
        if len(group) > 1:
            desc = " vs ".join(f"sp{g['sp_size']}/dp{g['dp_size']} at {int(g['seq_len']) // 1024}K: {g['peak_gb']} GB"
                               for g in group)
            pred = " vs ".join(f"{estimate(plan_for(g, True))['memory']['peak_allocated_gib']:.2f}" for g in group)
            print(f"  Same {local:,} tokens per rank on {gpus} ZeRO-3 shards, published {desc}; predicted {pred} GiB.")
    for r in rows:
        if r["sp_size"] == "1" and r["dp_size"] != "1" and r["peak_gb"]:
            # What the published DP figure would be under reading B if the row's seq_len were the global batch split
            # over the DP ranks (each rank seq_len/dp tokens): the only reading found that puts every row within 10%.
            split = {**r, "seq_len": str(int(r["seq_len"]) // int(r["dp_size"]))}
            got = estimate(plan_for(split, False))["memory"]["peak_allocated_gib"]
            print(f"  (B) with the sp1/dp{r['dp_size']} row at {split['seq_len']} tokens per rank ({int(r['seq_len']) // 1024}K "
                  f"split {r['dp_size']} ways): {got:.2f} GiB vs {r['peak_gb']} ({fmt_err(err(got, num(r['peak_gb']))).strip()}).")
    by_seq = {int(r["seq_len"]): r for r in rows if r["sp_size"] == "4" and r["tokens_per_s"]}
    if 32768 in by_seq and 65536 in by_seq:
        from backend.planner.throughput import flops_per_token
        from backend.planner.validate import parse

        def step_flops(seq):
            spec = parse(plan_for(by_seq[seq], True))[0]
            f = flops_per_token(spec)
            return (f["hw_matmul"] + f["hw_attention"]) * seq * 8

        def step_time(seq):
            return seq * 8 / float(by_seq[seq]["tokens_per_s"])

        print(f"  Published step time 32K -> 64K: x{step_time(65536) / step_time(32768):.2f}; FLOPs per step: "
              f"x{step_flops(65536) / step_flops(32768):.2f}. With the modelled compute (64K alone takes about the")
        print("  published 64K step), no single per-step overhead puts both rows within 25%; the global constant")
        print("  (CPU optimizer rate) is the minimax over the published rows.")
        # A bound that needs no efficiency figure: the extra FLOPs of the 64K step over the 32K step at 100% of the
        # GPU's dense bf16 peak. Fewest FLOPs per token: the layers' matmuls 8 per weight (forward 2, backward 4,
        # and the forward again that activation checkpointing recomputes), the lm_head 6 (not recomputed), causal
        # attention 8 * L * a * d * S (same count, no FlashAttention score recompute); tokens per GPU = 8 * S / sp.
        spec = parse(plan_for(by_seq[65536], True))[0]
        m = spec.model

        def min_flops_per_gpu(seq):
            per_token = (8 * m.num_hidden_layers * m.layer_matmul_params + 6 * m.vocab_size * m.hidden_size
                         + 8 * m.num_hidden_layers * m.num_attention_heads * m.head_dim * seq)
            return per_token * seq * 8 / int(by_seq[seq]["sp_size"])

        bound = (min_flops_per_gpu(65536) - min_flops_per_gpu(32768)) / (spec.gpu.bf16_dense_tflops * 1e12)
        incs = [65536 * 8 / float(by_seq[65536][k]) - 32768 * 8 / float(by_seq[32768][k])
                for k in ("tokens_per_s", "tokens_per_s_other_revision") if by_seq[32768][k] and by_seq[65536][k]]
        print(f"  At 100% of the H100's {spec.gpu.bf16_dense_tflops:.0f} TFLOPS and with the fewest FLOPs that a causal"
              f" 32K -> 64K step adds, the 64K step takes at least {bound:.1f} s")
        print(f"  more than the 32K step; the published rows differ by {' / '.join(f'{x:.1f}' for x in incs)} s.")
        if incs and max(incs) < bound:
            print("  The published tokens/s are not those of full-length causal sequences (packed shorter documents"
                  " would do it:\n  attention then grows with the document, not with seq_len).")
    if all(s in by_seq for s in (8192, 32768, 65536)):
        # Independent of the planner: any step time made of a fixed cost, a per-token cost and an attention cost
        # (each >= 0) is a + b*S + c*S^2 with a, b, c >= 0 at a fixed grad_accum. Solve it through the three points.
        pts = [(s / 8192, s * 8 / float(by_seq[s]["tokens_per_s"])) for s in (8192, 32768, 65536)]
        ca, cb, cc = _solve3([[1.0, x, x * x] for x, _ in pts], [t for _, t in pts])
        print(f"  Model-free: step time = a + b*S + c*S^2 through the published sp4 8K/32K/64K figures gives a = {ca:.2f} s,")
        print(f"  b = {cb:.2f} s and c = {cc:.2f} s per (8K)^2.", end="")
        if min(ca, cb, cc) < 0:
            print(" A negative coefficient, which no non-negative mix of fixed, per-token and attention (S^2)\n"
                  "  costs has, so no physical model passes through all three.")
        else:
            print(" All non-negative: a physical mix of fixed, per-token and attention costs can pass through them.")
    print(f"worst memory error (A, as stated): {a['worst_mem'][1] * 100:+.1f}% ({a['worst_mem'][2]}); "
          f"(B): {b['worst_mem'][1] * 100:+.1f}% ({b['worst_mem'][2]})")
    print(f"worst tokens/s error (A, as stated): {a['worst_tok'][1] * 100:+.1f}% ({a['worst_tok'][2]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
