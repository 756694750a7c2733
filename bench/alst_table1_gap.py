"""What the ALST paper's Table 1 max lengths (corpus rows A1-A5) need beyond the planner, beside the caching
allocator's overhead the project measured on its own H100 without expandable segments.

    .venv/bin/python bench/alst_table1_gap.py

A published max length is a memory measurement at the boundary: there the card is full. For each row the script
prints the planner's figures at the published length (allocated peak, reserved, device total), what is left of the
card (the bytes the paper's stack held that the planner does not), that remainder per token held by a rank, and the
reserved / allocated ratio the row implies if the remainder is the allocator's (the card less the CUDA context and
NCCL, over the planner's allocated peak). Beside them: reserved / allocated as measured by
torch.cuda.max_memory_reserved / max_memory_allocated on one H100 without expandable segments
(bench/results/gpu-nvidia-h100-80gb-hbm3-2026-11-27.csv, made by bench/gpu_check.py), and the planner's own ratio
for those plans (plan/allocator.py). docs/planner-accuracy.md ("The ALST Table 1 rows") reads the two together.
Nothing here sets a planner constant.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import _with_training, read_corpus  # noqa: E402
from plan import estimate  # noqa: E402
from plan.validation import validate  # noqa: E402

ROWS = ("A1-max", "A2-max", "A3-max", "A4-max", "A5-max", "ALST-8g-max")
H100_WINDOW = ROOT / "bench" / "results" / "gpu-nvidia-h100-80gb-hbm3-2026-11-27.csv"
KIB = 1024


def row_gap(row: dict) -> dict:
    """The planner at the row's published length and what the card has left there."""
    length = int(float(row["published"]))
    plan = _with_training(row["plan"], seq_len=length)
    spec = validate(plan).spec
    assert spec is not None, row["id"]
    mem = estimate(plan)["memory"]
    cap, alloc = mem["gpu_capacity_gib"], mem["peak_allocated_gib"]
    reserved, total = mem["reserved_gib"], mem["device_total_gib"]
    left = cap - total
    tokens = spec.local_tokens
    return {"id": row["id"], "length": length, "tokens": tokens, "alloc": alloc, "reserved": reserved,
            "total": total, "cap": cap, "left": left, "left_per_token": left * 2**30 / tokens,
            "implied_ratio": (cap - (total - reserved)) / alloc,
            "expandable": bool(plan["training"].get("expandable_segments", False))}


def window_ratios(path: Path = H100_WINDOW) -> list[dict]:
    """reserved / allocated peaks of the H100 window's runs that measured both (none with expandable segments),
    and the planner's reserved / allocated for the same plan."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if not (r["measured_allocated_gib"] and r["measured_reserved_gib"]):
                continue
            plan = json.loads(r["plan"])
            mem = estimate(plan)["memory"]
            out.append({"name": r["name"], "status": r["status"], "features": r["features"],
                        "expandable": bool(plan["training"].get("expandable_segments", False)),
                        "alloc": float(r["measured_allocated_gib"]), "reserved": float(r["measured_reserved_gib"]),
                        "planned_ratio": mem["reserved_gib"] / mem["peak_allocated_gib"]})
    return out


def main() -> None:
    by_id = {r["id"]: r for r in read_corpus()}
    print("ALST rows at their published length (planner as the corpus reads the row)")
    print(f"  {'row':12} {'length':>10} {'tok/rank':>9} {'exp.seg':>7} {'alloc':>7} {'reserved':>8} {'device':>7} "
          f"{'card':>5} {'left GiB':>8} {'left KiB/tok':>12} {'implied res/alloc':>17}")
    for rid in ROWS:
        g = row_gap(by_id[rid])
        print(f"  {g['id']:12} {g['length']:>10,} {g['tokens']:>9,} {str(g['expandable']):>7} {g['alloc']:7.2f} "
              f"{g['reserved']:8.2f} {g['total']:7.2f} {g['cap']:5.0f} {g['left']:8.2f} "
              f"{g['left_per_token'] / KIB:12.1f} {g['implied_ratio']:17.3f}")
    print()
    print(f"H100 window ({H100_WINDOW.name}): reserved / allocated peaks as measured, and as planned")
    print(f"  {'run':36} {'features':>10} {'exp.seg':>7} {'alloc':>7} {'reserved':>8} {'measured':>8} {'planned':>7}")
    for w in window_ratios():
        note = "" if w["status"] == "ok" else f"  ({w['status']})"
        print(f"  {w['name']:36} {w['features']:>10} {str(w['expandable']):>7} {w['alloc']:7.2f} {w['reserved']:8.2f} "
              f"{w['reserved'] / w['alloc']:8.3f} {w['planned_ratio']:7.3f}{note}")


if __name__ == "__main__":
    main()
