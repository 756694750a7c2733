"""The run state machine: the states and the changes allowed between them. backend/runs/transitions.py, the only
writer of a run's state, checks every change against ALLOWED with `check_transition`."""
from __future__ import annotations

from enum import StrEnum

from backend.core.errors import IllegalTransition

__all__ = ["ACTIVE", "ALLOWED", "TERMINAL", "IllegalTransition", "RunState", "check_transition"]


class RunState(StrEnum):
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OOM = "oom"
    CANCELLED = "cancelled"
    LOST = "lost"
    STOPPED = "stopped"  # stopped by a rule (an alert's run.stop_on_*), with a checkpoint; exit_reason says which


TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.OOM, RunState.CANCELLED, RunState.LOST,
                      RunState.STOPPED})
ACTIVE = frozenset({RunState.STARTING, RunState.RUNNING})

ALLOWED: dict[RunState, frozenset[RunState]] = {
    RunState.PENDING_APPROVAL: frozenset({RunState.QUEUED, RunState.CANCELLED}),
    RunState.QUEUED: frozenset({RunState.STARTING, RunState.CANCELLED}),
    RunState.STARTING: frozenset({RunState.RUNNING} | TERMINAL),
    RunState.RUNNING: TERMINAL,
    # A retry queues the next attempt of a run that did not succeed; it resumes from the last checkpoint.
    RunState.FAILED: frozenset({RunState.QUEUED}),
    RunState.OOM: frozenset({RunState.QUEUED}),
    RunState.CANCELLED: frozenset({RunState.QUEUED}),
    RunState.LOST: frozenset({RunState.QUEUED}),
    RunState.STOPPED: frozenset({RunState.QUEUED}),
}


def check_transition(current: str, wanted: RunState) -> None:
    if wanted not in ALLOWED.get(RunState(current), frozenset()):
        raise IllegalTransition(current, wanted)
