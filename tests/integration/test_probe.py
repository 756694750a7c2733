"""`ulab probe` for real (torchrun, 2 CPU ranks, gloo): a small Llama-shaped plan probed at 1, 2 and 4 layers,
extrapolated to its 8 layers, and compared with the real 8-layer run of the same plan (--full). The wide sweep
(depth 8 and 16, sp 1/2, ZeRO 2/3) is bench/probe.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import tiny_plan

pytestmark = pytest.mark.slow
ULAB = Path(sys.executable).with_name("ulab")


def test_probe_extrapolates_memory_to_the_full_depth_within_5_percent(tmp_path):
    plan = tiny_plan(sp_size=2, seq_len=256)
    plan["model"]["config"]["num_hidden_layers"] = 8
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "probe"
    proc = subprocess.run([str(ULAB), "probe", "--plan", str(tmp_path / "plan.json"), "--depths", "1,2,4", "--full",
                           "--steps", "3", "--text", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "extrap" in proc.stdout
    assert "planner" in proc.stdout
    assert "measured: fits with" in proc.stdout
    result = json.loads((out / "probe.json").read_text())
    assert result["depths"] == [1, 2, 4, 8]
    assert [m["status"] for m in result["measured"]] == ["ok"] * 4
    assert all(m["loss_finite"] and len(m["ranks"]) == 2 for m in result["measured"])
    check = result["check"]
    print("probe sp=2, 1-2-4 -> 8 layers: memory error per rank", check["peak_allocated_gib"]["error"],
          "step time error", check["step_time_s"]["error"])
    assert all(abs(e) < 0.05 for e in check["peak_allocated_gib"]["error"]), check
    assert result["predicted"]["peak_allocated_gib"] > 0
    assert result["source"]["peak_allocated_gib"] == "measured"


def test_a_plan_that_does_not_validate_is_refused_before_any_rank_starts(tmp_path):
    plan = tiny_plan(sp_size=2)
    plan["training"]["zero_stage"] = 7
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([str(ULAB), "probe", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: training.zero_stage: ")
    assert not (tmp_path / "o" / "depth-1").exists()
