"""Write the planner's uncertainty bands (plan/data/uncertainty_bands.csv) from the validation corpus.

    .venv/bin/python bench/planner_bands.py [--check]

For every regime (ulysses, offload, ring, packed) and kind (memory, time) the residuals r = log(published /
predicted) of the corpus rows (bench/corpus.py; positive = the planner was optimistic) are grouped by publication.
Leave-one-source-out: each fold builds the band [min r, max r] (with 0 inside) from the other publications and
tests it on the held-out one; the printed coverage is that out-of-sample share. The band written is the envelope of
the folds' bands (with two or more publications, every row's residual), so a new publication like the ones seen
lands inside it as often as the coverage says. A regime with fewer than plan.uncertainty.MIN_ROWS rows or
MIN_SOURCES publications uses the pooled band ("all": the DeepSpeed regimes' rows when they are enough, else every
regime's). Packed-document rows are checked, not used (see REGIMES); flagged rows (their own publication contradicts
them, bench/corpus_consistency.py) are left out. `--check` compares without writing.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import evaluate_all, source_key  # noqa: E402
from plan.uncertainty import ADD_S, BANDS_CSV, MIN_ROWS, MIN_SOURCES, SHORT_STEP_S  # noqa: E402

# Packed rows (documents of unknown length) are checked against the bands but do not make them: their residual is
# the distance outside the range of document lengths the row may have, not the error of an estimate.
REGIMES = ("ulysses", "offload", "ring")
# Step-time rows whose predicted step is under plan.uncertainty.SHORT_STEP_S make the "short" time band (and only it),
# as the planner reads them.
SHORT = "short"


def regime_of(res) -> str:
    if res.kind == "time" and res.row["quantity"] == "step_time" and isinstance(res.predicted, float) \
            and res.predicted < SHORT_STEP_S:
        return SHORT
    return res.row["regime"]


def _band(rs: list[float]) -> tuple[float, float]:
    return (min(0.0, *rs), max(0.0, *rs)) if rs else (0.0, 0.0)


def loso(by_source: dict[str, list], fold=None, inside=None) -> tuple[tuple[float, float], float | None]:
    """(envelope of the folds' bands, out-of-sample coverage) for values grouped by publication: residuals in log
    space by default; `fold` makes a band of values and `inside` says whether a value lies in one."""
    fold = fold or _band
    inside = inside or (lambda v, b: b[0] <= v <= b[1])
    folds, n_in, total = [], 0, 0
    for held in by_source:
        rest = [v for s, vs in by_source.items() if s != held for v in vs]
        if not rest:
            continue
        b = fold(rest)
        folds.append(b)
        n_in += sum(1 for v in by_source[held] if inside(v, b))
        total += len(by_source[held])
    if not folds:
        return fold([v for vs in by_source.values() for v in vs]), None
    return (min(f[0] for f in folds), max(f[1] for f in folds)), (n_in / total if total else None)


def loso_short(by_source: dict[str, list[tuple[float, float]]]) -> tuple[tuple[float, float], float | None]:
    """`loso` for the short steps' band: its low end in log space, its high end in seconds added to the step
    (plan.uncertainty ADD_S: fixed per-step costs add to a step whatever its length). Each value is a row's
    (log(published / predicted), published - predicted)."""
    return loso(by_source, lambda rows: (min(0.0, *(r for r, _ in rows)), max(0.0, *(a for _, a in rows))),
                lambda v, b: v[0] >= b[0] and v[1] <= b[1])


def compute() -> list[dict]:
    groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    short: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for res in evaluate_all():
        if res.residual is None or res.kind == "other" or res.row["regime"] not in REGIMES or res.flagged:
            continue
        src = source_key(res.row)
        if regime_of(res) == SHORT:  # the short steps' band is theirs alone: the pooled band serves long steps
            short[src].append((res.residual, float(res.row["published"]) - float(res.predicted)))
            continue
        groups[(regime_of(res), res.kind)][src].append(res.residual)
        groups[("every", res.kind)][src].append(res.residual)
        if res.row["regime"] != "ring":
            groups[("deepspeed", res.kind)][src].append(res.residual)
    # The pooled band ("all") a thin regime borrows: the DeepSpeed regimes' rows (the stack Ulysses Lab trains
    # with; the ring rows are mostly FSDP2 readings) when they are enough, else every regime's.
    for kind in ("memory", "time"):
        ds = groups.get(("deepspeed", kind), {})
        enough = sum(len(v) for v in ds.values()) >= MIN_ROWS and len(ds) >= MIN_SOURCES
        groups[("all", kind)] = ds if enough else groups.get(("every", kind), {})
    out = []
    for kind in ("memory", "time"):
        for regime in ("all", *REGIMES):
            g = groups.get((regime, kind), {})
            n = sum(len(v) for v in g.values())
            if regime != "all" and (n < MIN_ROWS or len(g) < MIN_SOURCES):
                continue
            (lo, hi), cov = loso(g)
            out.append({"regime": regime, "kind": kind, "low": f"{lo:.4f}", "high": f"{hi:.4f}", "high_form": "log",
                        "rows": n, "sources": len(g), "loso_coverage": "" if cov is None else f"{cov:.2f}"})
    n = sum(len(v) for v in short.values())
    if n >= MIN_ROWS and len(short) >= MIN_SOURCES:
        (lo, hi), cov = loso_short(short)
        out.append({"regime": SHORT, "kind": "time", "low": f"{lo:.4f}", "high": f"{hi:.4f}", "high_form": ADD_S,
                    "rows": n, "sources": len(short), "loso_coverage": "" if cov is None else f"{cov:.2f}"})
    return out


def render(rows: list[dict]) -> str:
    head = ("# Uncertainty bands of the planner's estimates, in log space (x -> [x e^low, x e^high]);\n"
            "# high_form add_s: the high end in seconds added to the step (x -> [x e^low, x + high]).\n"
            "# Written by bench/planner_bands.py from bench/data/published_corpus.csv: leave-one-source-out\n"
            "# envelope of the residuals log(published / predicted) (add_s: published - predicted) per regime;\n"
            "# loso_coverage = share of held-out rows inside.\n"
            "regime,kind,low,high,high_form,rows,sources,loso_coverage\n")
    return head + "".join(f"{r['regime']},{r['kind']},{r['low']},{r['high']},{r['high_form']},{r['rows']},"
                          f"{r['sources']},{r['loso_coverage']}\n" for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare with the committed table")
    args = ap.parse_args()
    text = render(compute())
    print(text, end="")
    if args.check:
        same = BANDS_CSV.read_text() == text
        print("committed table is", "up to date" if same else "STALE: run bench/planner_bands.py")
        return 0 if same else 1
    BANDS_CSV.write_text(text)
    print(f"wrote {BANDS_CSV.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
