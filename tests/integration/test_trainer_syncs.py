"""No host-device sync inside a training step from our trainer: two CPU ranks (Ulysses SP=2, ZeRO-2, TiledMLP, the
tiled logits loss, activation checkpointing, two micro batches of packed documents per step) count every call that
would make the host wait for a GPU (tests/integration/sync_probe.py: `.item()`, `.tolist()`, `.cpu()`, `bool()`,
`float()`, `synchronize`, ...) between the Trainer's step begin and step end. Our code makes none; what is left is the
libraries' own, at sites named here, and the count per step is held at its bound. The step's figures are read once,
after the optimizer step, by the metrics callback (outside the counted span)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.trainer_support import make_plan, write_documents

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
MICRO_BATCHES = 2
# The libraries' own reads inside a step, and how many each makes: DeepSpeed's ZeRO-1/2 step checks the grad norm
# for inf/NaN (runtime/utils.py is_invalid_grad_norm, three times per step); Transformers looks for packed
# sequences in position_ids once per forward (masking_utils.find_packed_sequence_indices); DeepSpeed's tiled logits
# loss tests a tensor in its backward (ulysses_sp.py TiledFusedLogitsLoss.backward) once per micro batch.
LIBRARY_SITES = {"is_invalid_grad_norm deepspeed/runtime/utils.py": 3,
                 "find_packed_sequence_indices transformers/masking_utils.py": MICRO_BATCHES,
                 "backward deepspeed/runtime/sequence_parallel/ulysses_sp.py": MICRO_BATCHES}


def test_a_step_reads_nothing_back_from_the_device_but_the_libraries_own(tmp_path: Path):
    data = write_documents(tmp_path / "docs.txt")
    plan = make_plan(tmp_path / "plan.json", data, sp=2, gas=MICRO_BATCHES, steps=2, seq_len=256,
                     training={"tiled_mlp": True, "tiled_logits_loss": True, "activation_checkpointing": True})
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "tests.integration.sync_probe", "--plan", str(plan), "--run-dir", str(run_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = json.loads((run_dir / "syncs.json").read_text())
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        ours = {site: n for site, n in s["calls"].items() if site.split()[-1].startswith(("worker/", "plan/"))}
        assert not ours, ours
        by_function: dict[str, int] = {}
        for site, n in s["calls"].items():
            function = site.split(" in ")[1].rsplit(":", 1)[0]  # "function path", without the line
            by_function[function] = by_function.get(function, 0) + n
        assert set(by_function) <= set(LIBRARY_SITES), s["calls"]
        for function, n in by_function.items():
            assert n <= LIBRARY_SITES[function], (function, s["calls"])
        assert s["count"] <= sum(LIBRARY_SITES.values()), s["calls"]
