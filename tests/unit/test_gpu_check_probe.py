"""The GPU check's probe part (bench/gpu_check_probe.py): its rows, and how a probe's result becomes a CSV row's
status and extrapolation columns. The part itself runs in `make gpu-rehearsal` (CPU) and `make gpu-check` (GPU)."""
from __future__ import annotations

from bench import gpu_check
from bench.gpu_check_probe import comparison, probe_status
from bench.gpu_check_rows import probe_rows


def test_the_probe_part_has_a_1b_and_an_8b_row_on_gpu_and_tiny_rows_on_cpu(tmp_path):
    gpu = {r.name: r for r in probe_rows(cuda=True)}
    assert set(gpu) == {"probe-llama-1b-8192", "probe-llama-3.1-8b-8192", "probe-llama-3.1-8b-8-layers-8192"}
    assert gpu["probe-llama-3.1-8b-8192"].model["num_hidden_layers"] == 32
    assert gpu["probe-llama-3.1-8b-8192"].model["hidden_size"] == 4096
    a = gpu_check.parse_args(["--cpu", "--out", str(tmp_path), "--parts", "probe"])
    rows = gpu_check.select(gpu_check.rows_for(gpu_check.Check(a, cuda=False)), a.part_set, None, None)
    assert [r.name for r in rows] == ["probe-tiny-8-layers-256", "probe-tiny-16-layers-2048"]
    assert all(r.estimate and r.estimate["valid"] for r in rows)


def _result(statuses: list[str], full: bool) -> dict:
    depths = [1, 2, 4] + ([8] if full else [])
    return {"plan_depth": 8, "depths": depths,
            "measured": [{"depth": d, "status": s} for d, s in zip(depths, statuses, strict=True)],
            "extrapolated": {"peak_allocated_gib": 2.0, "step_time_s": 0.5},
            "fits": {"peak_allocated_gib": {"slope": 0.2, "intercept": 0.3},
                     "step_time_s": {"slope": 0.05, "intercept": 0.1}},
            "check": {"peak_allocated_gib": {"error": [-0.02, 0.04]}, "step_time_s": {"error": -0.25}} if full else {}}


def test_status_and_columns_with_and_without_the_full_depth():
    assert probe_status(_result(["ok"] * 4, True), 0, True) == "ok"
    assert probe_status(_result(["ok"] * 3, False), 0, False) == "extrapolated"  # never loaded as calibration
    assert probe_status(_result(["ok", "oom", "skipped"], False), 0, False) == "oom"
    assert probe_status(None, 124, False) == "timeout"
    assert probe_status(None, 1, False) == "exit 1"
    cols = comparison(_result(["ok"] * 4, True))
    assert cols["extrapolated_allocated_gib"] == 1.9  # the line at 8 layers, not the full run's figure
    assert cols["extrapolated_step_time_s"] == 0.5
    assert cols["extrapolation_allocated_error_pct"] == 4.0  # the worst rank
    assert cols["extrapolation_step_time_error_pct"] == -25.0
    assert comparison(_result(["ok"] * 3, False))["extrapolation_allocated_error_pct"] is None
