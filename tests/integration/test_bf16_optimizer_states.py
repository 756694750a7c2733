"""`training.bf16_optimizer_states` acts: DeepSpeed engines built from the planner's own DeepSpeed config (2 CPU ranks
under torchrun, gloo) keep the master partition and the Adam moments in bf16 with the field on (6 bytes per
partition element) and in fp32 with it off (12), under ZeRO-2 and ZeRO-3; the planner's optimizer bytes per rank
match what the optimizer holds. Fails when the config does not carry DeepSpeed's bf16 keys (states stay fp32)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# DeepSpeed pads each rank's partition to an alignment (stage_1_and_2.py / stage3.py): a few elements at this size
TOLERANCE = 0.01


def test_bf16_optimizer_states_are_bf16_under_zero2_and_zero3_and_priced_as_measured():
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.integration.bf16_states_probe", "2", "3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line.removeprefix("PROBE ")) for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert [(r["stage"], r["bf16_optimizer_states"]) for r in rows] == [(2, False), (2, True), (3, False), (3, True)]
    for r in rows:
        assert r["world"] == 2, r
        assert r["planner_params"] == r["params"], r
        dtype, per_element = ("torch.bfloat16", 6) if r["bf16_optimizer_states"] else ("torch.float32", 12)
        assert r["master_dtype"] == [dtype], r
        assert r["moment_dtype"] == [dtype], r
        measured = r["master_bytes"] + r["moment_bytes"]
        # master + exp_avg + exp_avg_sq, each a copy of the rank's partition
        assert measured == per_element * r["master_elements"], r
        assert r["master_elements"] == pytest.approx(r["params"] / 2, rel=TOLERANCE), r
        assert r["planner_optimizer_bytes"] == pytest.approx(measured, rel=TOLERANCE), r
