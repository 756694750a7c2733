"""One step under torch.profiler, for benches that compare stacks op by op (bench/peer_alst.py --profile-step).

With ULAB_TRAINER_PROFILE_STEP=K in the environment, every rank profiles the Trainer's K-th step (CPU ops; CUDA
kernels too on a GPU) from its step begin to its step end and writes RUN_DIR/profile/step{K}-rank{R}.json: per op
name, its calls and its self time in microseconds (`op_table`). Runs of the service never set it; the profiled
step's own time is the profiler's as much as the step's."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import TrainerCallback

PROFILE_STEP_ENV = "ULAB_TRAINER_PROFILE_STEP"


def profile_step() -> int | None:
    """The step to profile (1-based), from the environment; None when unset."""
    value = os.environ.get(PROFILE_STEP_ENV, "").strip()
    return int(value) if value else None


def profiler() -> torch.profiler.profile:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def op_table(prof: torch.profiler.profile) -> dict[str, dict[str, float]]:
    """{op name: {"calls", "self_cpu_us", "self_device_us"}} of a finished profile."""
    return {e.key: {"calls": e.count, "self_cpu_us": e.self_cpu_time_total,
                    "self_device_us": getattr(e, "self_device_time_total", 0.0)} for e in prof.key_averages()}


def write_profile(run_dir: Path, step: int, rank: int, prof: torch.profiler.profile) -> Path:
    path = Path(run_dir) / "profile" / f"step{step}-rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(op_table(prof)))
    return path


class StepProfile(TrainerCallback):
    """Profiles the `step`-th optimizer step (the Trainer's global step, 1-based) of this rank. Registered before
    the metrics callback, so its step end comes first and the metrics gather is not in the profile."""

    def __init__(self, step: int, run_dir: Path, rank: int):
        self.step, self.run_dir, self.rank = step, Path(run_dir), rank
        self.prof: torch.profiler.profile | None = None

    def on_step_begin(self, args, state, control, **kw):
        if self.prof is None and state.global_step + 1 == self.step:
            self.prof = profiler()
            self.prof.__enter__()
        return control

    def on_step_end(self, args, state, control, **kw):
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.__exit__(None, None, None)
            write_profile(self.run_dir, self.step, self.rank, prof)
        return control
