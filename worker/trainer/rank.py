"""The rank's entry point: `python -m worker.trainer.rank --plan P --run-dir D [--resume]`, what torchrun starts
(plan.launch.torchrun_command) and what `accelerate launch` runs on each node of an export.

A rank joins the lock of its attempt (the launcher, `ulab train`, holds it; attempt.py), checks the plan and its
data as the launcher did, and trains (`train_rank`, which `ulab train` of a one-rank plan calls in its own process).
It never outlives torchrun: the kernel SIGKILLs it when torchrun dies. A rank that fails writes RUN_DIR/outcome.json
first (train.py); the launcher then writes the attempt's final record.
"""
from __future__ import annotations

import gc
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from plan.launch import RANK_MODULE

from . import attempt as attempts
from .cpu_info import share_cpu_info
from .exits import EXIT_FAILED
from .preflight import checked, resumable, say
from .spec import RunSpec


@contextmanager
def gc_off_for_imports() -> Iterator[None]:
    """The garbage collector off while this rank imports torch, Transformers and DeepSpeed: they make ~670,000
    objects (~250,000 of them garbage in cycles), and the automatic collections walked the survivors again and again
    as they piled up. `train.settle_imports()` then collects once, freezes what the imports left and turns the
    collector on for training; whatever way the block ends, it is on again. A rank's imports: 3.35 -> 2.87 CPU-s
    (medians of 3), peak RSS 398 -> 406 MiB (bench/rank_imports.py)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def train_rank(spec: RunSpec, run_dir: Path, resume: bool) -> int:
    """This process's rank trained to its end; its exit code (plan/outcome.py's)."""
    with gc_off_for_imports():
        from .train import train_this_rank

        return train_this_rank(spec, run_dir, resume)


def join_run_dir(run_dir: Path) -> attempts.RunLock:
    """Hold the run directory's lock with the launcher's attempt (a shared lock of this rank's own), and die with
    torchrun: if torchrun dies without stopping this rank, nobody else would. Raises attempt.LockBusy."""
    attempts.die_with_parent(signal.SIGKILL)
    lock = attempts.RunLock(os.environ.get(attempts.RUN_LOCK_ENV) or attempts.lock_file(run_dir))
    if attempts.RUN_LOCK_ENV in os.environ:  # else torchrun was started by hand (the planner's launch
        lock.join(int(os.environ.get(attempts.ATTEMPT_ENV, "1")))  # command): no `ulab train` holds it
    return lock


def run_rank(plan_path: Path, run_dir: Path, resume: bool) -> int:
    plan_path, run_dir = Path(plan_path), Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        join_run_dir(run_dir)
    except (attempts.LockBusy, OSError) as e:
        say(f"error: {e}")
        return EXIT_FAILED
    spec = checked(plan_path, run_dir, resume)
    if isinstance(spec, int):
        return spec
    resume = resumable(run_dir, resume, announce=os.environ.get("RANK") == "0")
    if spec.offload_optimizer:
        share_cpu_info()  # DeepSpeed's CPU Adam asks which CPU this is 3 times per rank, a subprocess each
    return train_rank(spec, run_dir, resume)


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog=f"python -m {RANK_MODULE}", description="Ulysses SP trainer: one rank")
    p.add_argument("--plan", required=True, type=Path)
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--resume", action="store_true")
    a = p.parse_args(argv)
    return run_rank(a.plan, a.run_dir, a.resume)


if __name__ == "__main__":
    sys.exit(main())
