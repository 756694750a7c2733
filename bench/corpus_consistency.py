"""Pairs of corpus rows whose published values disagree with each other, before any planner is asked.

    .venv/bin/python bench/corpus_consistency.py [--without-fp32-grad-buffer]

Two rows of one publication that describe the same per-rank memory (the same configuration; or the same model
states per rank and the same tokens per rank, where one adds only Ulysses' all-to-all buffers) must publish about
the same figure. When they do not, no estimate can be close to both: for published values a < b that should be
equal up to a known extra d (b's side), the best any single estimate can do is a worst relative error of
(b - d - a) / (a + b), reached when it errs the same share low on b and high on a. This script prints that floor
for each pair the corpus has, beside the planner's errors on the two rows, so the corpus summary
(bench/planner_validation.py) can be read with it: a row on the wrong side of such a pair holds the "worst error"
of its regime whatever the physics.

The rule the corpus applies (`flagged`): a pair whose floor exceeds CONTRADICTION (memory rows) or TIME_CONTRADICTION
(step time, tokens/s, MFU) contradicts itself, and both of its rows are flagged, since published values alone cannot
say which one is wrong. Flagged rows stay in the corpus and in its tables with their error; they leave the accuracy
targets and the uncertainty bands.

Besides the pairs named in PAIRS, every row a publication gives twice (its `-rev2` row: another revision of the same
post, the same plan) makes a pair with the first figure (`revision_pairs`).

No planner constant is derived from here; the planner is asked only for the all-to-all buffer bytes (d) and for its
current predictions.

--without-fp32-grad-buffer: the open lead of docs/planner-accuracy.md (not in the planner): the ulysses
memory rows as they would read if ZeRO-3's fp32 gradient buffer did not stay on the GPU through forward and
backward (DeepSpeed stage3.py `initialize_optimizer_states` drops it when nothing is offloaded) and each step made
the fp32 gradients of its largest sub group instead (`_prepare_fp32_grad_for_sub_group`: a flat copy in the
training dtype, then its fp32 cast, 6 B per element at once).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2**30
# A pair contradicts itself when no one estimate can be within this share of both rows: the memory target the
# project holds reproduced rows of one publication to (bench/planner_accuracy.py, "within 10% on memory").
CONTRADICTION = 0.10
# Time rows contradict themselves past the step-time target the corpus's time rows are held to (within 15%:
# bench/planner_validation.py time_target_lines): no one estimate could meet it on both rows.
TIME_CONTRADICTION = 0.15
TIME_QUANTITIES = ("step_time", "tokens_per_s", "mfu")
# The id suffix of a row that is another revision of a publication's figure (bench/data/published_corpus.csv).
REVISION = "-rev2"


@dataclass(frozen=True)
class Pair:
    low: str    # the row that publishes less
    high: str   # the row that publishes more (or the same configuration plus Ulysses' buffers)
    why: str    # why the two must publish about the same figure


PAIRS = (
    Pair("M3-mem-b", "M3-mem-a",
         "the same configuration (the corpus reads both ms-swift scripts as Qwen2.5-7B, DP=4, 16,384 tokens, "
         "ZeRO-3, Liger, GA 2)"),
    Pair("HF-4g-sp1-8K-mem", "HF-4g-sp4-32K-mem",
         "the same ZeRO-3 states per rank (Qwen3-4B sharded over 4 ranks either way) and the same 8,192 tokens "
         "per rank (DP=4 at 8K; Ulysses SP=4 at 32K holds 32K/4 outside attention), SP adding only its all-to-all "
         "buffers"),
    Pair("A5-max", "ALST-8g-max",
         "the same switches on the same 8 H100s by the corpus's readings: Table 1 read cumulatively gives A5 every "
         "ALST feature (SP 8, tiled loss, TiledMLP, checkpoint offload), as the abstract's 3.7M is stated; the "
         "table's row after A5, not given, may hold the difference"),
)


def all_to_all_bytes(row: dict) -> float:
    """What the planner counts for Ulysses' all-to-all buffers in the row's plan (0 without SP)."""
    from plan.memory import activation_terms
    from plan.validation import validate

    spec = validate(row["plan"]).spec
    assert spec is not None
    return float(activation_terms(spec)["layer"]["comm_buffers"])


def floor(a: float, b: float, d: float) -> float:
    """The smallest worst relative error one estimate can have on published a and b (a < b) that should differ
    by d: errs x high on a and x low on b with a (1 + x) = b (1 - x) - d."""
    return max(0.0, (b - d - a) / (a + b))


def revision_pairs(rows: dict[str, dict]) -> tuple[Pair, ...]:
    """A pair for every row given again by another revision of its publication (`<id>-rev2` beside `<id>`)."""
    out = []
    for rid, row in rows.items():
        first = rows.get(rid.removesuffix(REVISION)) if rid.endswith(REVISION) else None
        if first is None:
            continue
        low, high = sorted((first, row), key=lambda r: float(r["published"]))
        out.append(Pair(low["id"], high["id"], "two revisions of one publication give the same configuration two "
                                               "figures"))
    return tuple(out)


def pairs(rows: dict[str, dict]) -> tuple[Pair, ...]:
    return PAIRS + revision_pairs(rows)


def pair_floor(rows: dict[str, dict], pair: Pair) -> float:
    """The floor of a pair from the rows' published values (and the all-to-all bytes the higher row adds when its
    plan differs by Ulysses' degree)."""
    lo, hi = rows[pair.low], rows[pair.high]
    adds_buffers = (hi["quantity"] != "max_context" and hi["plan"]["parallel"]["sp_size"] > 1
                    and hi["plan"] != lo["plan"])
    d = all_to_all_bytes(hi) / GIB if adds_buffers else 0.0
    return floor(float(lo["published"]), float(hi["published"]), d)


def limit(rows: dict[str, dict], pair: Pair) -> float:
    """The floor past which the pair contradicts itself: the time target for time rows, else the memory one."""
    return TIME_CONTRADICTION if rows[pair.high]["quantity"] in TIME_QUANTITIES else CONTRADICTION


def flagged(rows: list[dict]) -> set[str]:
    """The ids of the rows in a pair that contradicts itself (floor above its `limit`)."""
    by_id = {r["id"]: r for r in rows}
    return {i for p in pairs(by_id) if pair_floor(by_id, p) > limit(by_id, p) for i in (p.low, p.high)}


def without_fp32_grad_buffer() -> None:
    import plan.memory as pm
    from bench.corpus import read_corpus
    from plan.validation import validate

    print("ulysses memory rows without ZeRO-3's resident fp32 gradient buffer (a what-if; the planner keeps it)")
    for row in read_corpus():
        if row["regime"] != "ulysses" or row["quantity"] not in ("reserved", "allocated"):
            continue
        spec = validate(row["plan"]).spec
        assert spec is not None
        m = pm.estimate_memory(spec)
        st, zb, act = pm.state_terms(spec), pm.zero_buffer_terms(spec), pm.activation_terms(spec)
        on_gpu = spec.zero_stage == 3 and not spec.offload_optimizer and spec.dtype_bytes < 4
        n = min(spec.model.total_params / spec.world, pm.SUB_GROUP_SIZE) if on_gpu else 0.0
        base = st["params"] + st["grads"] - 4 * n + st["optimizer"] + act["framework"]
        loss = base + act["loss"]["activations"] + act["loss"]["logits_and_loss"] + zb["loss"]
        layer = base + act["layer"]["activations"] + act["layer"]["comm_buffers"] + zb["layer"]
        step = base + 6 * n
        allocated = max(loss, layer, step)
        old = m["allocated"] if row["quantity"] == "allocated" else m["reserved"]
        new = allocated + (0.0 if row["quantity"] == "allocated" else m["reserved"] - m["allocated"])
        pub = float(row["published"])
        print(f"  {row['id']:<24} published {pub:5.1f}  planner {old / GIB:5.1f} ({old / GIB / pub - 1:+6.1%})  "
              f"without {new / GIB:5.1f} ({new / GIB / pub - 1:+6.1%})")


def main() -> int:
    if "--without-fp32-grad-buffer" in sys.argv[1:]:
        without_fp32_grad_buffer()
        return 0
    from bench.corpus import evaluate_all

    results = {r.row["id"]: r for r in evaluate_all()}
    rows = {i: r.row for i, r in results.items()}
    print("pairs of rows that should publish the same figure (published values only); a floor above "
          f"{CONTRADICTION:.0%} (memory) or {TIME_CONTRADICTION:.0%} (time) flags both rows\n")
    for pair in pairs(rows):
        lo, hi = results[pair.low], results[pair.high]
        a, b = float(lo.row["published"]), float(hi.row["published"])
        x = pair_floor(rows, pair)
        print(f"{pair.low} {a:g} vs {pair.high} {b:g} {hi.row['unit']} ({(b - a) / a:+.1%}): {pair.why}")
        print(f"  the best one estimate can do on both: worst error {x:.1%}"
              f"{' -> both flagged' if x > limit(rows, pair) else ''}")
        print(f"  the planner: {pair.low} {lo.predicted:,.1f} ({lo.error:+.1%}), "
              f"{pair.high} {hi.predicted:,.1f} ({hi.error:+.1%})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
