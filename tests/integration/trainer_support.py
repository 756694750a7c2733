"""Helpers shared by the trainer integration tests: tiny plans, packed-document data, `ulab train` runs."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.tiny import tiny_plan
from worker.trainer.attempt import read_metrics

ULAB = Path(sys.executable).parent / "ulab"
CONTRACT = Path(__file__).resolve().parents[1] / "contract"

def write_documents(path: Path, n_docs: int = 400) -> Path:
    """Documents of different lengths separated by blank lines, so packed rows hold several documents."""
    words = ("ulysses splits the sequence across ranks and trades it for attention heads with one all to all "
             "before and after attention while zero shards the optimizer states gradients and parameters").split()
    docs = []
    for i in range(n_docs):
        n = 5 + (i * 37) % 40
        docs.append(" ".join(words[(i * 11 + j * 3) % len(words)] for j in range(n)) + ".")
    path.write_text("\n\n".join(docs) + "\n")
    return path


def make_plan(path: Path, data: Path, *, sp: int = 1, dp: int = 1, gas: int = 1, steps: int = 8,
              seq_len: int = 256, nodes: int = 1, training: dict | None = None, **run) -> Path:
    """Write tests.tiny.tiny_plan() with a run section (`steps` on `data`, lr 1e-3, seed 0, no checkpoints)."""
    plan = tiny_plan(sp, seq_len, dp, nodes, grad_accum=gas, **(training or {}))
    plan["run"] = {"steps": steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)},
                   "model_path": None, "checkpoint_every": 0, **run}
    path.write_text(json.dumps(plan, indent=1))
    return path


def train(plan: Path, run_dir: Path, *, resume: bool = False, resume_from: str | None = None,
          timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [str(ULAB), "train", "--plan", str(plan), "--run-dir", str(run_dir)] + (["--resume"] if resume else [])
    cmd += ["--resume-from", resume_from] if resume_from else []
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def metrics(run_dir: Path) -> list[dict]:
    """The run's step records over all its attempts (a resume writes a file of its own)."""
    return read_metrics(run_dir)


def check_ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-3000:]}"
