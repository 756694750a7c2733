"""What the launcher (`ulab train`, launcher.py) and each rank (rank.py) check before training: the plan against this
machine, the checkpoint a resume continues from and every stage's data (`validate`), the allocator setting, and how
a refusal is said and recorded."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from plan.outcome import Cause, Outcome, write_outcome

from .exits import EXIT_BAD_INPUT, say_last_words
from .spec import PlanError, RunSpec, check_model_source, load_plan


def say(line: str) -> None:
    say_last_words(line)  # kept outside the run directory too: a full disk swallows the print
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def validate(plan_path: Path, run_dir: Path, resume: bool = False) -> RunSpec:
    """Parse the plan, check it against this machine and the checkpoint a resume continues from, and make sure
    every stage has data; raises PlanError / data.DataError with one line."""
    spec = RunSpec.from_plan(load_plan(plan_path))
    check_model_source(spec)
    if spec.depends_on_device:  # torch only then: the launcher of a multi-rank run need not import it
        import torch

        spec.check_device(cuda=torch.cuda.is_available())
    if resume:
        from .checkpoints import resume_problem

        problem = resume_problem(run_dir, spec)
        if problem:
            raise PlanError(problem)
    from .data import prepare_all_stages  # numpy + tokenizer, no torch.distributed

    prepare_all_stages(spec, Path(run_dir), base_dir=Path(plan_path).resolve().parent)
    return spec


def set_alloc_conf(spec: RunSpec) -> None:
    """PYTORCH_CUDA_ALLOC_CONF (training.expandable_segments) in this process's environment, before anything touches
    CUDA: torchrun passes it on to the ranks, and a rank started by hand sets it for itself here."""
    from plan.launch import ALLOC_CONF_ENV, alloc_conf

    value = alloc_conf(spec.spec, os.environ.get(ALLOC_CONF_ENV))
    if value is not None:
        os.environ[ALLOC_CONF_ENV] = value


def checked(plan_path: Path, run_dir: Path, resume: bool) -> RunSpec | int:
    """`validate` and `set_alloc_conf`; a refused plan, data or checkpoint reference answers its exit code."""
    from .data import DataError

    try:
        spec = validate(plan_path, run_dir, resume)
        set_alloc_conf(spec)
    except (PlanError, DataError) as e:
        return bad_input(run_dir, f"error: {e}")
    return spec


def bad_input(run_dir: Path, line: str) -> int:
    """A plan, data or checkpoint reference the trainer refuses: said, and recorded (exit code 2)."""
    say(line)
    write_outcome(run_dir, Outcome.of(Cause.ERROR, line, exit_code=EXIT_BAD_INPUT))
    return EXIT_BAD_INPUT


def resumable(run_dir: Path, resume: bool, announce: bool) -> bool:
    """Whether a --resume has a checkpoint to continue from; without one the run starts from step 1 (said once,
    where `announce`)."""
    if resume and not any(run_dir.glob("checkpoints/stage*/checkpoint-*/trainer_state.json")):
        if announce:
            print(f"--resume: no checkpoint under {run_dir / 'checkpoints'} yet; starting from step 1", flush=True)
        return False
    return resume
