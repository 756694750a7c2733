"""Probe runs: a stored plan trained for a few steps at reduced depth with random weights, on the plan's
own GPUs, through the normal queue and executor, as a run of kind "probe" (worker/probe.py runs it). Its result
(plan/probe.py: measured per depth and rank, extrapolated to the model's depth, the planner's figures beside) is
stored with the plan and filed in the calibration store as measured rows of its GPU type (CPU ranks: GPU "cpu").

A probe is minutes of the plan's GPUs and carries no data or weights of the user's, but it passes the same gate as a
run (backend/runs/gate.py): the plan's owner or an approver asks for it, within the size bounds; one whose estimate
fits is queued at once, one whose estimate does not fit waits in `pending_approval` for an approver (approve
anyway, under ULAB_MAX_FORCED_GIB_PER_GPU; a plan above that cap is refused at once). A plan whose queue no worker
serves is refused at once (409), not queued to wait."""
from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.auth.roles import Permission
from backend.auth.service import Principal
from backend.core.errors import UserError
from backend.core.queue import plan_gpu_name, queue_for, workers_on
from backend.core.settings import get_settings
from backend.executors.registry import executor_name
from backend.inputs.paths import check_limits
from backend.plans.schemas import ProbeRequest
from backend.plans.service import get_plan, valid_or_422
from backend.runs import gate, transitions
from backend.runs.models import Run
from backend.runs.service import enqueue
from backend.runs.states import RunState
from plan.model import Plan
from plan.probe import DEPTHS

log = logging.getLogger(__name__)


def submit_probe(session: Session, plan_id: int, body: ProbeRequest, by: Principal) -> Run:
    """A probe run of the stored plan, queued when its estimate fits, else pending an approver's approval (403 for
    someone else's plan, 422 naming the field for a plan or depth that cannot be probed or a size bound, 409 above
    the forced cap or when no worker serves the plan's queue)."""
    stored = get_plan(session, plan_id)
    if not by.can(Permission.APPROVE) and not gate.owns(stored, by):
        raise UserError(403, "authorization", f"plan {plan_id} is another user's: only its owner or an approver may "
                                              "probe it")
    # the stored plan without its run section, before it is validated: a probe brings its own (worker/probe.py)
    plan = valid_or_422({k: v for k, v in stored.spec.items() if k != "run"})
    layers = _layers(plan)
    if body.depths is not None and any(d > layers for d in body.depths):
        raise UserError(422, "depths", f"the model has {layers} layers; probe depths must not exceed it "
                                       f"(asked {sorted(body.depths)})")
    depths = sorted(set(body.depths or [d for d in DEPTHS if d <= layers]))
    settings = get_settings()
    check_limits(plan, settings)
    gate.check_forced_cap(stored.estimate)
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
    if gate.does_not_fit(run.estimate):  # an approver's to approve anyway (POST /api/runs/{id}/approve?force=true)
        session.commit()
        return run
    gate.check_queue(run, by)
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
