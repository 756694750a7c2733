"""`ulab train` and the per-rank entry point.

`run_train` validates the plan and prepares (tokenizes and packs) the data before any rank starts, so a bad
plan or bad data ends with one clear line on stderr and exit code 2. Then, with more than one rank in the plan
and outside torchrun, it starts the ranks with `torchrun_command` (the same list the worker launches);
inside torchrun (LOCAL_RANK set) or for a single rank it trains in this process.

`--resume` continues from the newest complete checkpoint (step numbering, optimizer, LR schedule and data
position); without any checkpoint yet it starts from step 1, so a retry can always pass --resume.

Exit codes: 0 done; 1 training failed (reason on the last stderr line, also in RUN_DIR/error.txt);
2 bad plan or data; 3 out of memory; 75 stopped by SIGTERM after saving a checkpoint (resume with --resume).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .launch_config import nodes_and_ranks_per_node, torchrun_command
from .spec import PlanError, RunSpec, load_plan

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_OOM, EXIT_PREEMPTED = 0, 1, 2, 3, 75


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def validate(plan_path: Path, run_dir: Path) -> RunSpec:
    """Parse the plan and make sure every stage has data; raises PlanError / data.DataError with one line."""
    spec = RunSpec.from_plan(load_plan(plan_path))
    from .data import prepare_all_stages  # numpy + tokenizer, no torch.distributed

    prepare_all_stages(spec, Path(run_dir), base_dir=Path(plan_path).resolve().parent)
    return spec


def run_train(plan_path: Path, run_dir: Path, resume: bool) -> int:
    plan_path, run_dir = Path(plan_path), Path(run_dir)
    from .data import DataError

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        spec = validate(plan_path, run_dir)
    except (PlanError, DataError) as e:
        _say(f"error: {e}")
        try:
            with open(run_dir / "error.txt", "a") as f:
                f.write(f"error: {e}\n")
        except OSError:
            pass
        return EXIT_BAD_INPUT
    if resume and not any(run_dir.glob("checkpoints/stage*/checkpoint-*/trainer_state.json")):
        if "LOCAL_RANK" not in os.environ or os.environ.get("RANK") == "0":
            print(f"--resume: no checkpoint under {run_dir / 'checkpoints'} yet; starting from step 1", flush=True)
        resume = False
    if spec.world_size > 1 and "LOCAL_RANK" not in os.environ:
        return _launch_ranks(spec, plan_path, run_dir, resume)
    from .train import train_this_rank

    return train_this_rank(spec, run_dir, resume)


def _launch_ranks(spec: RunSpec, plan_path: Path, run_dir: Path, resume: bool) -> int:
    nnodes, per_node = nodes_and_ranks_per_node(spec.plan)
    endpoint = os.environ.get("ULAB_RDZV_ENDPOINT")
    if nnodes > 1 and not endpoint:
        _say(f"error: hardware.num_nodes={nnodes}: set ULAB_RDZV_ENDPOINT=host:port (and ULAB_NODE_RANK) on every node")
        return EXIT_BAD_INPUT
    cmd = torchrun_command(plan_path, run_dir, resume=resume, nproc_per_node=per_node, nnodes=nnodes,
                           node_rank=int(os.environ.get("ULAB_NODE_RANK", "0")), rdzv_endpoint=endpoint,
                           rdzv_id=os.environ.get("ULAB_RDZV_ID"))
    err_file = run_dir / "error.txt"
    err_file.unlink(missing_ok=True)
    # torchrun stays in this process group: whoever stops the group (the worker's cancel, Ctrl-C in a terminal)
    # reaches torchrun and every rank at once; the ranks checkpoint and stop. Forwarding the signal again from
    # here would hit torchrun twice, and a second SIGTERM makes it quit before its ranks have saved.
    proc = subprocess.Popen(cmd)
    old = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if rc == 0:
        return EXIT_OK
    reason = err_file.read_text().strip().splitlines()[-1] if err_file.exists() else ""
    code = EXIT_FAILED
    if reason.startswith("preempted"):
        code = EXIT_PREEMPTED
    elif "out of memory" in reason:
        code = EXIT_OOM
    _say(reason or f"error: torchrun exited with code {rc}")
    return code


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m worker.trainer", description="Ulysses SP trainer (one rank)")
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    return run_train(a.plan, a.run_dir, a.resume)
