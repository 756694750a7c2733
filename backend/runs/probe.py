"""Probe runs (issue 27): a stored plan trained for a few steps at reduced depth with random weights, on the plan's
own GPUs, through the normal queue and executor, as a run of kind "probe" (worker/probe.py runs it). Its result
(plan/probe.py: measured per depth and rank, extrapolated to the model's depth, the planner's figures beside) is
stored with the plan and filed in the calibration store as measured rows of its GPU type (CPU ranks: GPU "cpu").

A probe is minutes of the plan's GPUs and carries no data or weights of the user's: it is queued without an
approval. A plan whose queue no worker serves is refused at once (409), not queued to wait."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.auth.service import Principal
from backend.core.errors import UserError
from backend.core.queue import plan_gpu_name, queue_for, workers_on
from backend.core.settings import get_settings
from backend.plans.models import Plan as PlanRow
from backend.plans.schemas import ProbeRequest
from backend.plans.service import get_plan, valid_or_422
from backend.runs import transitions
from backend.runs.executors import executor_name
from backend.runs.models import Run
from backend.runs.states import RunState
from plan.model import Plan
from plan.probe import DEPTHS

log = logging.getLogger(__name__)
RESULT = "probe.json"  # worker/probe.py writes it in the run directory


def submit_probe(session: Session, plan_id: int, body: ProbeRequest, by: Principal) -> Run:
    """A probe run of the stored plan, queued (422 naming the field for a plan or depth that cannot be probed, 409
    when no worker serves the plan's queue)."""
    from backend.runs.service import enqueue

    stored = get_plan(session, plan_id)
    # the stored plan without its run section, before it is validated: a probe brings its own (worker/probe.py)
    plan = valid_or_422({k: v for k, v in stored.spec.items() if k != "run"})
    layers = _layers(plan)
    if body.depths is not None and any(d > layers for d in body.depths):
        raise UserError(422, "depths", f"the model has {layers} layers; probe depths must not exceed it "
                                       f"(asked {sorted(body.depths)})")
    depths = sorted(set(body.depths or [d for d in DEPTHS if d <= layers]))
    settings = get_settings()
    try:
        executor = executor_name(plan, settings)
    except ValueError as e:
        raise UserError(422, "hardware.gpu", str(e)) from None
    if executor == "celery":
        gpu = plan_gpu_name(plan)
        queue = queue_for(gpu)
        if workers_on(queue) == 0 and not _busy_worker(session, gpu):
            raise UserError(409, "hardware.gpu", f"no worker serves the queue {queue} of {gpu} GPUs: "
                                                 f"start one (ulab worker --gpu-type {gpu}) and probe "
                                                 "again")
    run = Run(name=f"probe of {stored.name or f'plan {stored.id}'}", plan_id=stored.id, kind="probe",
              attempt=1,
              spec=plan.effective(), probe_request={"depths": depths, "steps": body.steps},
              estimate=stored.estimate, submitted_by=by.token_id, executor=executor,
              steps=0)  # its depths' steps ship no metrics, so transitions.finish looks for none
    session.add(run)
    session.flush()  # the row's default state (pending_approval) is set; transitions moves it from there
    transitions.approve(run, by.token_id, forced=False)
    session.commit()
    enqueue(run)
    session.refresh(run)
    return run


def _busy_worker(session: Session, gpu: str) -> bool:
    """Whether a Celery run of this GPU type is under way: its worker (one task at a time, solo pool) cannot answer
    a broadcast while it trains, but it is there and takes the probe next."""
    active = session.scalars(select(Run).where(Run.executor == "celery", Run.state.in_(
        [RunState.STARTING.value, RunState.RUNNING.value])))
    return any(plan_gpu_name(run.plan) == gpu for run in active)


def _layers(plan: Plan) -> int:
    import plan as planner

    v = planner.validate(plan)
    assert v.spec is not None
    return v.spec.model.num_hidden_layers


def record_probe(session: Session, run: Run) -> dict | None:
    """Store a finished probe's result with its plan and in the calibration store; None without a result."""
    from backend.calibration.service import CPU, record_measured

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
