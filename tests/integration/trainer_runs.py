"""Trained layouts shared by the trainer test files (test_trainer_runs, _resume, _features) and by pytest-xdist's
processes: each layout trains once per pytest session, under a file lock in a directory every process of the
session sees, and the others wait for it and read it. Real `ulab train` runs (torchrun, CPU ranks, gloo, sdpa) of
a tiny Llama on packed multi-document data."""
from __future__ import annotations

import fcntl
import shutil
from contextlib import contextmanager
from pathlib import Path

from tests.integration.trainer_support import check_ok, make_plan, metrics, train, write_documents

STEPS = 20
SINGLE_STEPS = 10
TRAINED = ".trained"
EVALS = {"eval_rows": 1, "eval_every": 5}  # written into a run directory once its layout trained to the end


@contextmanager
def locked(path: Path):
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Runs:
    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        with locked(root / "docs.lock"):
            self.data = root / "docs.txt"
            if not self.data.exists():
                write_documents(root / "docs.tmp").rename(self.data)

    def get(self, name: str, **layout) -> Path:
        run_dir = self.root / name
        with locked(self.root / f"{name}.lock"):
            if not (run_dir / TRAINED).exists():
                shutil.rmtree(run_dir, ignore_errors=True)  # a process that failed here left a partial run
                plan = make_plan(self.root / f"{name}.json", self.data, **layout)
                proc = train(plan, run_dir, timeout=600)  # a loaded machine: seen 365 s for the ALST run
                check_ok(proc)
                (run_dir / "console.txt").write_text(proc.stdout + proc.stderr)
                (run_dir / TRAINED).touch()
        return run_dir

    # the three layouts that must agree: one process, Ulysses SP=2, data parallel 2 (same rows per step); each holds
    # its last row back and scores it by position every 5 steps (worker/trainer/evaluate.py), which must agree too
    def single(self):  # the slowest layout (one process does all the work): fewer steps
        return self.get("single", sp=1, dp=1, gas=2, steps=SINGLE_STEPS, **EVALS)

    def sp2(self):
        return self.get("sp2", sp=2, dp=1, gas=2, steps=STEPS, checkpoint_every=6, keep_checkpoints=2, **EVALS)

    def dp2(self):
        return self.get("dp2", sp=1, dp=2, gas=1, steps=STEPS, **EVALS)

    def alst(self):
        """Every ALST memory feature on, ZeRO-3 with optimizer and parameter offload (test_trainer_features,
        test_trainer_memory)."""
        alst = {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "activation_checkpointing": True,
                "checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True, "expandable_segments": True}
        return self.get("alst", sp=2, dp=1, gas=2, steps=5, training=alst)

    def stages(self):
        """Two training stages and a passkey test between them, ZeRO-2 with checkpoint offload (the plan is
        estimated at its longest seq_len)."""
        return self.get("stages", sp=2, dp=1, gas=1, steps=1, seq_len=512,
                        stages=[{"seq_len": 256, "steps": 4},
                                {"kind": "passkey", "seq_len": 512, "lengths": [128, 512], "depths": [0, 0.5, 1]},
                                {"seq_len": 512, "steps": 3}], eval_rows=1,
                        training={"activation_checkpointing": True, "checkpoint_offload": True})

    def sp2dp2(self):  # 4 ranks, 2 rows per step like `single`; a checkpoint after step 3 (odd). Only
        return self.get("sp2dp2", sp=2, dp=2, gas=1, steps=5, checkpoint_every=3,  # test_trainer_resume uses it
                        **EVALS)


def losses(run_dir: Path) -> list[float]:
    return [m["loss"] for m in metrics(run_dir)]
