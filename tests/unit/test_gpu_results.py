"""The planner against the GPU rows this project measured itself (bench/results/gpu-*.csv, written by
`make gpu-check` on a lent GPU; the API loads the same rows as calibration). Each finished row's measured peak
allocated memory must lie in the planner's stated range and within 15% of its point estimate; the ranges are the
planner's own (plan/bands.py), not fitted to these rows."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from plan import estimate

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def measured_rows() -> list[dict]:
    rows = []
    for path in sorted(RESULTS.glob("gpu-*.csv")):
        with open(path, newline="") as f:
            for r in csv.DictReader(line for line in f if line.strip() and not line.startswith("#")):
                if r["status"] == "ok" and r.get("measured_allocated_gib"):
                    rows.append({**r, "file": path.name})
    return rows


def test_there_are_measured_gpu_rows():
    assert len(measured_rows()) >= 7  # the H100 check: 7 finished rows


@pytest.mark.parametrize("row", measured_rows(), ids=lambda r: f"{r['file']}:{r['name']}")
def test_the_planner_holds_each_measured_gpu_row(row):
    memory = estimate(json.loads(row["plan"]))["memory"]
    measured = float(row["measured_allocated_gib"])
    low, high = memory["peak_allocated_gib_range"]
    assert low <= measured <= high, (row["name"], measured, memory["peak_allocated_gib_range"])
    error = (memory["peak_allocated_gib"] - measured) / measured
    assert abs(error) <= 0.15, (row["name"], measured, memory["peak_allocated_gib"])
