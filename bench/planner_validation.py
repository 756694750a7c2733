"""The planner against every published measurement of its validation corpus (bench/data/published_corpus.csv).

    .venv/bin/python bench/planner_validation.py [--markdown]

One line per row: published value, prediction, error, the stated range and whether it covers the published value,
grouped by regime (ulysses = Ulysses/DP on DeepSpeed ZeRO, offload, ring, packed documents) and by quantity; then a
summary per regime. Packed rows (documents of unknown length) are predicted as a range from 512-token documents to
whole-length ones; their error is the distance outside it. `--markdown` prints the tables of docs/planner-accuracy.md
instead. No planner constant is fitted to these rows (bench/planner_bands.py turns their residuals into the bands;
tests/unit/test_planner_corpus.py holds every row's error where it is). Both print the targets last: the memory
bands' leave-one-source-out coverage and half-width, and the Ulysses/ALST memory rows (flagged rows out).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import Result, evaluate_all, source_key  # noqa: E402

REGIMES = ("ulysses", "offload", "ring", "packed")
QUANTITIES = ("device_total", "reserved", "allocated", "max_context", "step_time", "tokens_per_s", "mfu", "fits")


def fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if abs(x) >= 10000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.1f}"


def pred_text(r: Result) -> str:
    if r.predicted_range:
        return f"{fmt(r.predicted_range[0])}..{fmt(r.predicted_range[1])}"
    if r.row["quantity"] == "fits":
        return f"{r.predicted} ({r.extra['verdict']})"
    return fmt(r.predicted)


def band_text(r: Result) -> str:
    return "-" if not r.band else f"{fmt(r.band[0])}..{fmt(r.band[1])}"


def err_text(r: Result) -> str:
    if r.row["quantity"] == "fits":
        return "right" if r.error == 0 else "WRONG"
    return "-" if r.error is None else f"{r.error * 100:+.1f}%"


def cov_text(r: Result) -> str:
    return "-" if r.covered is None else ("yes" if r.covered else "NO")


def half_width(r: Result) -> float | None:
    if not r.band or not r.predicted or isinstance(r.predicted, bool):
        return None
    centre = r.predicted
    return (r.band[1] - r.band[0]) / 2 / centre


def summary(results: list[Result]) -> dict:
    """Figures over the rows that are not flagged (flagged rows keep their error in the tables)."""
    flagged = sum(1 for r in results if r.flagged)
    results = [r for r in results if not r.flagged]
    errs = [abs(r.error) for r in results if r.error is not None]
    covs = [r.covered for r in results if r.covered is not None]
    hws = [h for r in results if (h := half_width(r)) is not None]
    return {"rows": len(results), "flagged": flagged, "within15": sum(1 for e in errs if e <= 0.15), "n_err": len(errs),
            "worst": max(errs) if errs else None, "median": statistics.median(errs) if errs else None,
            "covered": sum(covs), "n_cov": len(covs),
            "median_half_width": statistics.median(hws) if hws else None}


def summary_line(name: str, s: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{x * 100:.1f}%"
    return (f"{name:<8} rows {s['rows']:>2} (+{s['flagged']} flagged) | within 15%: {s['within15']}/{s['n_err']} "
            f"| median |error| "
            f"{pct(s['median'])} | worst {pct(s['worst'])} | range covers {s['covered']}/{s['n_cov']} | "
            f"median half-width {pct(s['median_half_width'])}")


def is_target_row(r: Result) -> bool:
    """The Ulysses/ALST rows the memory targets are read on: the ulysses regime's memory rows and every ALST paper
    memory or fits row, flagged rows out."""
    alst = source_key(r.row) == "ALST paper"
    memory = r.kind == "memory" or r.row["quantity"] == "fits"
    return not r.flagged and memory and (r.row["regime"] == "ulysses" or alst)


def band_lines(results: list[Result]) -> list[str]:
    """The memory bands' targets: leave-one-source-out coverage (bench/planner_bands.py, per regime and over every
    held-out row) and the median half-width of the ranges stated on the memory rows (flagged out)."""
    from bench.planner_bands import compute

    folds = [b for b in compute() if b["kind"] == "memory" and b["regime"] != "all" and b["loso_coverage"]]
    held = sum(b["rows"] for b in folds)
    pooled = sum(float(b["loso_coverage"]) * b["rows"] for b in folds) / held if held else None
    widths = [h for r in results if r.kind == "memory" and not r.flagged and (h := half_width(r)) is not None]
    per = ", ".join(f"{b['regime']} {float(b['loso_coverage']):.0%}" for b in folds)
    return [f"memory bands: leave-one-source-out coverage {'-' if pooled is None else f'{pooled:.0%}'} ({per}); "
            f"median half-width {statistics.median(widths):.1%} over {len(widths)} memory rows"]


def target_lines(results: list[Result]) -> list[str]:
    """The memory targets: within 15% on at least 80% of the Ulysses/ALST rows, none past 25%, every `safe` max
    context at or below the published one, and every fits row right."""
    rows = [r for r in results if is_target_row(r)]
    errs = [r for r in rows if r.error is not None and r.row["quantity"] != "fits"]
    within = sum(1 for r in errs if abs(r.error) <= 0.15)
    worst = max(errs, key=lambda r: abs(r.error))
    over = [r.row["id"] for r in rows if r.row["quantity"] == "max_context" and r.band
            and r.band[0] > float(r.row["published"])]
    wrong = [r.row["id"] for r in rows if r.row["quantity"] == "fits" and r.error]
    return [*band_lines(results),
            f"targets on the Ulysses/ALST memory rows ({len(rows)} rows, flagged out):",
            f"  within 15%: {within}/{len(errs)} ({within / len(errs):.0%}); worst {worst.row['id']} "
            f"{worst.error * 100:+.1f}%",
            f"  safe max context above the published one: {', '.join(over) or 'none'}",
            f"  fits rows wrong: {', '.join(wrong) or 'none'}"]


def time_target_lines(results: list[Result]) -> list[str]:
    """The step-time targets: within 15% on at least 80% of the time rows (step time, tokens/s, MFU; flagged out),
    and every H100 window row inside the estimate's step-time range."""
    rows = [r for r in results if r.kind == "time" and not r.flagged and r.error is not None]
    within = sum(1 for r in rows if abs(r.error) <= 0.15)
    gpu = [r for r in rows if source_key(r.row) == "Ulysses Lab GPU check"]
    outside = [r.row["id"] for r in gpu if not r.covered]
    return [f"targets on the time rows ({len(rows)} rows, flagged out):",
            f"  within 15%: {within}/{len(rows)} ({within / len(rows):.0%})",
            f"  H100 window rows outside their step-time range: {', '.join(outside) or 'none'} (of {len(gpu)})"]


def text(results: list[Result]) -> None:
    print("published corpus: bench/data/published_corpus.csv; errors are (predicted - published) / published")
    for regime in REGIMES:
        rows = [r for r in results if r.row["regime"] == regime]
        print(f"\n== {regime} ==")
        for q in QUANTITIES:
            qs = [r for r in rows if r.row["quantity"] == q]
            if not qs:
                continue
            print(f"-- {q}")
            for r in qs:
                print(f"  {r.row['id']:<32} published {r.row['published']:>9}  predicted {pred_text(r):>20}  "
                      f"error {err_text(r):>7}  range {band_text(r):>20}  covered {cov_text(r)}"
                      f"{'  FLAGGED' if r.flagged else ''}")
    print("\n== summary per regime ==")
    for regime in REGIMES:
        print(summary_line(regime, summary([r for r in results if r.row["regime"] == regime])))
    print(summary_line("all", summary(results)))
    print()
    for line in (*target_lines(results), *time_target_lines(results)):
        print(line)


def bands_markdown() -> None:
    """The committed uncertainty bands (plan/data/uncertainty_bands.csv) as a table."""
    import csv
    import math

    from plan.uncertainty import ADD_S, BANDS_CSV

    with open(BANDS_CSV, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    print("| regime | kind | range of published / predicted | rows | publications | left-out publication covered |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        high = (f"predicted + {float(r['high']):.2f} s" if r.get("high_form") == ADD_S
                else f"{math.exp(float(r['high'])):.2f}x")
        print(f"| {r['regime']} | {r['kind']} | {math.exp(float(r['low'])):.2f}x to {high} "
              f"| {r['rows']} | {r['sources']} | {r['loso_coverage'] or '-'} |")
    print()


def markdown(results: list[Result]) -> None:
    bands_markdown()
    print("| row | regime | quantity | published | predicted | error | range | covered | flagged |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for regime in REGIMES:
        for r in results:
            if r.row["regime"] == regime:
                print(f"| {r.row['id']} | {regime} | {r.row['quantity']} | {r.row['published']} | {pred_text(r)} | "
                      f"{err_text(r)} | {band_text(r)} | {cov_text(r)} | {'yes' if r.flagged else ''} |")
    print()
    print("| regime | rows (flagged out) | flagged | within 15% | median abs. error | worst | range covers "
          "| median half-width |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for regime in (*REGIMES, "all"):
        s = summary([r for r in results if regime == "all" or r.row["regime"] == regime])

        def pct(x):
            return "-" if x is None else f"{x * 100:.1f}%"
        print(f"| {regime} | {s['rows']} | {s['flagged']} | {s['within15']}/{s['n_err']} | {pct(s['median'])} | "
              f"{pct(s['worst'])} | "
              f"{s['covered']}/{s['n_cov']} | {pct(s['median_half_width'])} |")
    print("\nTargets:\n")
    for line in (*target_lines(results), *time_target_lines(results)):
        print(f"- {line.strip()}")


BOUNDS = ROOT / "bench" / "data" / "corpus_error_bounds.csv"


def write_bounds(results: list[Result]) -> None:
    """Each row's current |error| (fits rows: 0 right, 1 wrong) and coverage: the bounds
    tests/unit/test_planner_corpus.py holds the planner to. Rewrite only when a change makes rows better."""
    with open(BOUNDS, "w") as f:
        f.write("# Per-row error bounds of the validation corpus (bench/planner_validation.py --write-bounds).\n"
                "# tests/unit/test_planner_corpus.py fails if a row's |error| grows past its bound (+ a small\n"
                "# tolerance) or a covered row stops being covered.\n"
                "id,abs_error,covered\n")
        for r in results:
            e = "" if r.error is None else f"{abs(r.error):.4f}"
            f.write(f"{r.row['id']},{e},{'' if r.covered is None else int(r.covered)}\n")
    print(f"wrote {BOUNDS.relative_to(ROOT)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--write-bounds", action="store_true", help="store every row's error as its bound")
    args = ap.parse_args()
    results = evaluate_all()
    (markdown if args.markdown else text)(results)
    if args.write_bounds:
        write_bounds(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
