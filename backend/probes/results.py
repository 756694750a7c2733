"""What a probe leaves behind: its result stored with its plan and in the calibration store when its attempt
succeeds (backend/execution/outcome.py), and the approval rule that a `tight` plan needs a passing probe
(backend/runs/service.py). Kept apart from submitting a probe (service.py), which needs the executors, so the
places where an attempt ends never import the executors back."""
from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy.orm import Session

from backend.calibration.service import CPU, record_measured
from backend.core.settings import get_settings
from backend.plans.models import Plan as PlanRow
from backend.runs.models import Run

RESULT = "probe.json"  # worker/probe.py writes it in the run directory


def record_probe(session: Session, run: Run) -> dict | None:
    """Store a finished probe's result with its plan and in the calibration store; None without a result."""
    path = Path(run.run_dir or "") / RESULT
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    result["run_id"] = run.id
    if run.device is None:  # what the probe's ranks ran on: the runs list and run page name it, not the plan's GPU
        run.device = "cuda" if result.get("device") == "cuda" else CPU
    row = session.get(PlanRow, run.plan_id) if run.plan_id is not None else None
    if row is not None:
        row.probe = result
    measured = {q: result["extrapolated"].get(q) for q in ("peak_allocated_gib", "reserved_gib", "device_total_gib",
                                                            "tokens_per_s")}
    plan = run.plan.model_copy(update={"run": None}).effective()  # the calibration store keeps the plan's JSON
    record_measured(session, "probe", f"probe run {run.id}", plan, measured, run.id,
                    gpu=None if run.device == "cuda" else CPU)
    session.commit()
    return result


def tight_without_probe(session: Session, run: Run) -> str | None:
    """Why a run may not be approved yet under ULAB_APPROVE_TIGHT_NEEDS_PROBE: its planner verdict is `tight` and its
    plan has no probe that measured it fitting; None otherwise (also where the estimate states no verdict)."""
    if not get_settings().approve_tight_needs_probe or run.kind == "probe":
        return None
    verdict = ((run.estimate or {}).get("memory") or {}).get("verdict")
    if verdict != "tight":
        return None
    row = session.get(PlanRow, run.plan_id) if run.plan_id is not None else None
    measured = ((row.probe if row is not None else None) or {}).get("verdict") or {}
    if measured.get("fits") is True:
        return None
    why = measured.get("text") or "it has not been probed"
    return (f"the planner's verdict is tight and approving a tight plan needs a passing probe "
            f"(ULAB_APPROVE_TIGHT_NEEDS_PROBE): {why}; measure the plan first (POST /api/plans/{run.plan_id}/probe)")
