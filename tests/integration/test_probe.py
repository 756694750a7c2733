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


def test_a_depth_that_runs_out_of_memory_is_a_result_and_the_deeper_ones_are_skipped(tmp_path):
    """A real allocation failure in the one launch (a 2^24-token vocabulary of width 2^13: 512 GiB of fp32
    embeddings, the first tensor each depth's model allocates) on 2 ranks: the probe still answers, with a verdict."""
    plan = tiny_plan(sp_size=2, seq_len=256)
    plan["model"]["config"].update(num_hidden_layers=4, vocab_size=2**24, hidden_size=2**13, num_attention_heads=64,
                                   num_key_value_heads=8)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "probe"
    proc = subprocess.run([str(ULAB), "probe", "--plan", str(tmp_path / "plan.json"), "--depths", "1,2",
                           "--steps", "2", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert [(m["depth"], m["status"]) for m in result["measured"]] == [(1, "oom"), (2, "skipped")]
    assert "out of memory on rank" in result["measured"][0]["reason"]
    assert result["verdict"]["fits"] is False
    assert result["verdict"]["text"] == "measured: does not fit even at 1 layer"
    assert "probe: 2 depth(s) in 1 launch(es)" in proc.stderr


def test_zero3_depths_one_after_the_other_in_one_launch(tmp_path):
    """sp=2 ZeRO-3: each depth's random model is built outside zero.Init (the previous depth's DeepSpeed config is
    unregistered between depths: left registered, depth 2's model is built under zero.Init with it and DeepSpeed's
    batch-size check fails), and the extrapolation to 8 layers is compared with the real 8-layer run."""
    plan = tiny_plan(sp_size=2, seq_len=256)
    plan["model"]["config"]["num_hidden_layers"] = 8
    plan["training"]["zero_stage"] = 3
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "probe"
    proc = subprocess.run([str(ULAB), "probe", "--plan", str(tmp_path / "plan.json"), "--depths", "1,2,4", "--full",
                           "--steps", "3", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert [(m["depth"], m["status"]) for m in result["measured"]] == [(1, "ok"), (2, "ok"), (4, "ok"), (8, "ok")], \
        [m.get("reason") for m in result["measured"]]
    assert "probe: 4 depth(s) in 1 launch(es)" in proc.stderr
    errors = result["check"]["peak_allocated_gib"]["error"]
    print("probe sp=2 ZeRO-3, 1-2-4 -> 8 layers: memory error per rank", errors, "in", result["wall_s"], "s")
    assert all(abs(e) < 0.05 for e in errors), result["check"]
