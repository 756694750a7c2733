"""Each memory feature the planner counts, shown to act (each test fails where its feature is a no-op), and the
planner's per-rank peak against what the CPU ranks measure. Reuses the session's trained runs (trainer_runs.py);
the feature drops and the checkpoint offload run in one process (no torchrun)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.trainer_memory import TOLERANCE, feature_drops, measured, planned
from tests.tiny import TINY_LLAMA
from worker.trainer.offload_summary import read_lines as read_offload_lines

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
LAYERS = TINY_LLAMA["num_hidden_layers"]


def states(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "states.jsonl").read_text().splitlines()]


def test_checkpoint_offload_takes_every_layer_input_under_zero2_and_zero3():
    """Real DeepSpeed engines (one process): every checkpointed layer's input is marked and taken by its checkpoint;
    with CPU tensors allowed to move (DeepSpeed keeps them in place on CPU ranks), all but the newest go to host
    memory and come back in backward. Under ZeRO-3, marking at `__call__` (DeepSpeed's marker) took none."""
    proc = subprocess.run([sys.executable, "-m", "tests.integration.offload_probe", "2", "3"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [r["stage"] for r in rows] == [2, 3]
    for r in rows:
        assert r["layers"] == LAYERS, r
        assert r["marked"] == r["taken"] == LAYERS, r
        assert r["offloaded"] == r["restored"] == LAYERS - 1, r
        assert r["kept_last"] == 1, r
    assert rows[0]["loss"] == rows[1]["loss"]


def test_the_trainer_marks_every_checkpointed_layer_under_zero3_and_zero2(runs):
    """The trainer's own wiring, in real runs: ZeRO-3 (the ALST run) and ZeRO-2 (the two-stage run, a new model per
    stage) log every layer's input marked and taken; on CPU ranks DeepSpeed keeps them in place."""
    for run_dir in (runs.alst(), runs.stages()):
        lines = read_offload_lines((run_dir / "console.txt").read_text())
        assert lines, (run_dir / "console.txt").read_text()[-2000:]
        for x in lines:
            assert x["marked"] == x["taken"] == x["in_place"] == LAYERS, lines
            assert x["offloaded"] == 0, lines


def test_the_trainer_names_the_loss_it_runs(runs):
    """Rank 0 says once which loss it computes (`make gpu-check` holds it to the plan's liger_fused_loss): the ALST
    run's tiled logits loss, the two-stage run's cross-entropy on fp32 logits."""
    assert "loss: tiled logits loss" in (runs.alst() / "console.txt").read_text()
    assert "loss: cross-entropy on fp32 logits" in (runs.stages() / "console.txt").read_text()


@pytest.fixture(scope="module")
def drops():
    return feature_drops()


@pytest.mark.parametrize(("feature", "share"), [("tiled_mlp", 0.5), ("tiled_logits_loss", 0.5),
                                                ("upcast_logits", 0.4)])
def test_tiling_drops_the_activation_peak_as_the_planner_says(drops, feature, share):
    """One forward and backward, the model built and switched as the trainer does, under the trainer's CPU meter,
    at a size where the feature's phase is the peak. Measured: MLP 85.6 -> 11.4 MiB, loss 105.4 -> 17.7 MiB, the
    bf16 loss without the fp32 upcast 101.4 -> 53.4 MiB, planned within 1% of each; a no-op feature leaves the
    measured peak where it was."""
    d = drops[feature]
    planned_drop = d["planned_off"] - d["planned_on"]
    measured_drop = d["measured_off"] - d["measured_on"]
    assert planned_drop > share * d["planned_off"], d  # the planner counts the feature here
    assert abs(measured_drop - planned_drop) <= 0.05 * planned_drop, d
    for k in ("off", "on"):
        assert abs(d[f"measured_{k}"] - d[f"planned_{k}"]) <= 0.05 * d[f"planned_{k}"], d


def test_zero3_ranks_hold_a_partition_of_the_parameters(runs):
    """Between forwards a ZeRO-3 rank keeps its 1/world partition (DeepSpeed pads each parameter to a multiple of
    the world); ZeRO-2 keeps every parameter on every rank."""
    z3 = states(runs.alst())[0]
    world = len(z3["ranks"])
    assert z3["zero_stage"] == 3
    assert world == 2
    for r in z3["ranks"]:  # measured: 69792 of 139584 on each rank
        total = r["param_elements_total"]
        assert total / world <= r["param_elements"] <= total / world + 64, r  # padding: < world per parameter
    z2 = states(runs.sp2())[0]
    assert z2["zero_stage"] == 2
    assert all(r["param_elements"] == r["param_elements_total"] for r in z2["ranks"]), z2


def test_offloaded_optimizer_steps_with_deepspeed_cpu_adam(runs):
    """Optimizer offload: ZeRO hands the step to DeepSpeedCPUAdam, whose states (Adam's moments, on the CPU) are the
    ones that stepped; without offload the states belong to torch's AdamW."""
    for r in states(runs.alst())[0]["ranks"]:
        assert r["optimizer"] == "DeepSpeedCPUAdam", r
        assert r["optimizer_offload"], r
        assert r["optimizer_state_devices"] == ["cpu"], r
        assert r["optimizer_steps"] == 1, r
        assert r["optimizer_state_bytes"] >= 2 * 4 * r["param_elements_total"] / 2, r  # exp_avg, exp_avg_sq
    for r in states(runs.sp2())[0]["ranks"]:
        assert r["optimizer"] == "AdamW", r
        assert not r["optimizer_offload"], r


def test_expandable_segments_reach_every_rank_and_are_recorded(runs):
    """training.expandable_segments sets PYTORCH_CUDA_ALLOC_CONF before the ranks start (the launcher's
    environment, inherited through torchrun); each rank records what it started with."""
    assert all(r["alloc_conf"] == "expandable_segments:True" for r in states(runs.alst())[0]["ranks"])
    assert all(r["alloc_conf"] is None for r in states(runs.sp2())[0]["ranks"])


# the planner against the CPU ranks: the runs of trainer_runs.py at their last step (the optimizer states exist). Until
# PackedRows copied its rows, every other step's meter also counted the whole packed dataset (1.4 MiB: a batch's rows
# were views of it), e.g. SP=2: 4.89 MiB in steps 2-19, 3.52 MiB in step 20
PLANNER_ROWS = {"single": 10, "sp2": 20, "dp2": 20, "sp2dp2": 5, "alst": 5, "stages": 7}


@pytest.mark.parametrize("name", sorted(PLANNER_ROWS))
def test_planner_predicts_the_cpu_ranks_peak(runs, name):
    """plan.memory's per-rank peak for the run's own plan (less the CUDA-only cuBLAS workspace) against the trainer's
    CPU meter (live tensor storages, per rank). TOLERANCE and the table: bench/trainer_memory.py, README."""
    run_dir = getattr(runs, name)()
    plan = json.loads((run_dir.parent / f"{name}.json").read_text())
    want = planned(plan)["bytes"]
    got = max(measured(run_dir, PLANNER_ROWS[name])["allocated"])
    lo, hi = TOLERANCE
    assert lo <= got / want <= hi, (name, got / 2**20, want / 2**20)
