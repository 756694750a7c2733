"""The planner's step time against the step times a GPU check measured (bench/results/gpu-*.csv), row by row.

    .venv/bin/python bench/gpu_step_times.py [CSV ...]

Each row's own plan (the CSV's `plan` column) is estimated again with the planner as it is now, so the figures
follow the planner, not the prediction the check wrote beside the measurement. Per row: the measured step time (the
median of the steps after the first), the estimate, its error, the stated range and whether the measurement lies
inside, and the estimate's terms. Prints figures; asserts nothing.
"""
from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plan import estimate  # noqa: E402

DEFAULT = sorted((ROOT / "bench" / "results").glob("gpu-*.csv"))


def main(paths: list[Path]) -> None:
    inside = within = n = 0
    for path in paths:
        print(f"== {path.relative_to(ROOT)}")
        for row in csv.DictReader(path.open(newline="")):
            if not row.get("step_time_s"):
                continue
            t = estimate(json.loads(row["plan"]))["throughput"]
            measured, predicted = float(row["step_time_s"]), t["step_time_s"]
            lo, hi = t["step_time_s_range"]
            err = (predicted - measured) / measured
            n += 1
            inside += lo <= measured <= hi
            within += abs(err) <= 0.15
            terms = ", ".join(f"{k} {v:.3g}" for k, v in t["time_breakdown_s"].items() if v)
            print(f"{row['name']:34s} measured {measured:7.3f} s  estimate {predicted:7.3f} s  {100 * err:+6.1f}%  "
                  f"range {lo:.3g}..{hi:.3g} {'inside' if lo <= measured <= hi else 'OUTSIDE'}  ({terms})")
    print(f"{n} rows: {within} within 15%, {inside} inside the stated range")


if __name__ == "__main__":
    main([Path(p).resolve() for p in sys.argv[1:]] or DEFAULT)
