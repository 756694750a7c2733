"""The executor interface and the choice of executor for a run."""
from __future__ import annotations

import os
from typing import Protocol

from backend.core.queue import queue_for
from backend.core.settings import Settings
from backend.runs.models import Run

EXECUTORS = ("celery", "slurm")


class Executor(Protocol):
    def submit(self, run: Run) -> None:
        """Hand the queued run (its live attempt) to the engine; safe to call again for the same attempt."""


def gpu_name(spec: dict) -> str:
    gpu = spec.get("hardware", {}).get("gpu", "")
    return gpu.get("name", "custom") if isinstance(gpu, dict) else str(gpu)


def executor_name(spec: dict, settings: Settings) -> str:
    """The executor of the run's GPU queue (ULAB_EXECUTOR_<QUEUE>; celery when unset)."""
    name = settings.per_queue("executor", queue_for(gpu_name(spec))).strip().lower() or "celery"
    if name not in EXECUTORS:
        raise ValueError(f"ULAB_EXECUTOR_{queue_for(gpu_name(spec)).upper().replace('-', '_')}={name!r}: "
                         f"must be one of {', '.join(EXECUTORS)}")
    return name


def slurm_configured() -> bool:
    """Whether any GPU queue runs on Slurm (then the API starts the Slurm poller)."""
    return any(k.startswith("ULAB_EXECUTOR_") and v.strip().lower() == "slurm" for k, v in os.environ.items())


def executor_for(run: Run) -> Executor:
    if run.executor == "slurm":
        from backend.executors.slurm import SlurmExecutor

        return SlurmExecutor()
    from backend.executors.celery import CeleryExecutor

    return CeleryExecutor()
