"""Where an attempt ends, for every executor: a probe's result is stored before the run reads `succeeded` (the
page that waits for it then finds the result with the plan), the state change itself, then the run's calibration
point (its prediction beside its measurement). The Celery worker (through backend/execution/agent.py) and the Slurm
poller (backend/executors/slurm/poller.py) both end attempts here, so the two can no longer drift apart. Neither
by-product
ever fails the run."""
from __future__ import annotations

import logging
from collections.abc import Callable

from backend.calibration.service import record_run
from backend.core.db import session_scope
from backend.probes.results import record_probe as store
from backend.runs.models import Run
from backend.runs.states import RunState

log = logging.getLogger(__name__)
# the ends whose measurement says something about the plan (a cancelled, lost or stopped attempt says little)
CALIBRATED = frozenset({RunState.SUCCEEDED, RunState.OOM, RunState.FAILED})


def end_attempt(run_id: int, state: RunState, move: Callable[[], bool]) -> bool:
    """End the run's live attempt in `state` with `move` (a function of backend/runs/transitions.py, which answers
    whether it changed the run), storing a probe's result before and the calibration point after; answers `move`'s
    answer. Nothing is recorded for an attempt `move` no longer owns."""
    if state == RunState.SUCCEEDED:
        record_probe(run_id)
    moved = move()
    if moved and state in CALIBRATED:
        record_calibration(run_id)
    return moved


def record_calibration(run_id: int) -> None:
    """Store the finished run's prediction next to its measurement (backend/calibration), if it ran at least one
    step: a run that never trained measured nothing."""
    try:
        with session_scope() as session:
            run = session.get(Run, run_id)
            if run is not None and run.last_step > 0:
                record_run(session, run.id, run.attempt, run.spec)
    except Exception:  # calibration is a by-product of a run, not part of its outcome
        log.exception("run %s: could not record its calibration point", run_id)


def record_probe(run_id: int) -> None:
    """Store a finished probe's result with its plan and in the calibration store (backend/probes/results.py)."""
    try:
        with session_scope() as session:
            run = session.get(Run, run_id)
            if run is not None and run.kind == "probe" and store(session, run) is None:
                log.warning("probe run %s left no %s in %s", run_id, "probe.json", run.run_dir)
    except Exception:  # the probe's own files keep what it measured
        log.exception("probe run %s: could not store its result", run_id)
