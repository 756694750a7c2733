"""The one gate in front of `queued`: approve, approve anyway (force), retry, "resume from here" and a probe all pass
`check_queue` before transitions.approve / queue_retry move the run. Its rules:
- queued by someone allowed to: an approver, or the plan's owner for a probe whose estimate fits;
- approved at least once: a run never approved can only be approved (a cancelled `pending_approval` run is not
  retried into the queue);
- within the size bounds (backend/runs/guard.check_limits: steps, sequence length, GPUs);
- the estimate fits, or the run is forced (now, or at its approval) and still under ULAB_MAX_FORCED_GIB_PER_GPU;
- its sources are there (the data, and a checkpoint that is the planned model; a probe has neither);
- a running worker of its queue has its attention kernel and Liger, when any reports (backend/workers);
- and every function of EXTRA_CHECKS (other checks hook in there: one line each).
Each refusal is a UserError (409/422) naming the field."""
from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import object_session

from backend.auth.roles import Permission
from backend.auth.service import Principal
from backend.core.errors import UserError
from backend.core.settings import get_settings
from backend.inputs import model_source, tokenizer_source
from backend.inputs.paths import check_limits
from backend.plans.models import Plan as PlanRow
from backend.runs.models import Run
from backend.runs.states import RunState
from backend.workers import service as workers

# (run, who queues it, forced) -> None, or raise UserError. Called last, in order, on every path to `queued`.
QueueCheck = Callable[[Run, Principal, bool], None]


def check_worker_kernels(run: Run, by: Principal, forced: bool) -> None:
    """Every path to `queued` checks that the queue's workers have the plan's kernels (backend/workers/service.py)."""
    session = object_session(run)
    if session is not None:
        workers.check_kernels(session, run.plan)


EXTRA_CHECKS: list[QueueCheck] = [check_worker_kernels]


def does_not_fit(estimate: dict | None) -> str | None:
    """Why the plan's estimate says the run will not fit (GPU or CPU memory), or None."""
    memory = (estimate or {}).get("memory") or {}
    if memory.get("fits") is False:
        lo, hi = memory.get("device_total_gib_range") or (None, None)
        if memory.get("verdict") == "tight":
            return (f"the estimate may not fit: {lo}-{hi} GiB per GPU (the range of published measurements), "
                    f"the GPU has {memory.get('gpu_capacity_gib')} GiB")
        return (f"the estimate needs {memory.get('device_total_gib')} GiB per GPU; "
                f"the GPU has {memory.get('gpu_capacity_gib')} GiB")
    if memory.get("cpu_fits") is False:
        return f"the estimate needs {memory.get('cpu_gib_per_node')} GiB of CPU memory per node, more than the node has"
    return None


def check_sources(run: Run) -> None:
    """Before a run takes GPUs: its data and checkpoint must be there and be the planned model. A checkpoint
    resolved since submit (e.g. downloaded into the cache) is stored in the spec."""
    model_source.check_data(run.plan)
    plan = model_source.resolve(run.plan, get_settings(), strict=True)
    plan = tokenizer_source.check_tokenizer(plan, get_settings())
    if plan is not run.plan:
        run.spec = plan.effective()


def check_queue(run: Run, by: Principal, force: bool = False) -> bool:
    """Whether `by` may put `run` into `queued` now (approve: the run is pending_approval; retry: it ended). Raises
    UserError when not; answers whether the run goes as forced (its estimate does not fit)."""
    reason = does_not_fit(run.estimate)
    if not by.can(Permission.APPROVE) and not (run.kind == "probe" and not reason and owns(plan_row(run), by)):
        raise UserError(403, "authorization", "only an approver may queue a run (and the plan's owner a probe whose "
                                              "estimate fits)")
    approving = run.state == RunState.PENDING_APPROVAL.value
    if not approving and run.approved_at is None:
        raise UserError(409, "state", f"run {run.id} was never approved ({run.state}): it cannot be queued again; "
                                      "submit it anew and have it approved")
    check_limits(run.plan, get_settings())
    forced = force or (run.forced and not approving)
    if reason and not forced:
        raise UserError(409, "estimate.memory", f"{reason}. \"Approve anyway\" starts it regardless and "
                                                "records on the run that it was approved against the estimate")
    check_forced_cap(run.estimate)
    if run.kind != "probe":  # a probe trains random weights on random tokens (worker/probe.py)
        check_sources(run)
    for check in EXTRA_CHECKS:
        check(run, by, bool(reason))
    return bool(reason)


def check_forced_cap(estimate: dict | None) -> None:
    """409 for an estimate that does not fit and asks more than even a forced run may (ULAB_MAX_FORCED_GIB_PER_GPU)."""
    reason = does_not_fit(estimate)
    cap = get_settings().max_forced_gib_per_gpu
    need = ((estimate or {}).get("memory") or {}).get("device_total_gib")
    if reason and isinstance(need, int | float) and need > cap:
        raise UserError(409, "estimate.memory", f"{reason}, above the {cap:g} GiB per GPU that even a forced run may "
                                                "ask for (ULAB_MAX_FORCED_GIB_PER_GPU)")


def plan_row(run: Run) -> PlanRow | None:
    session = object_session(run)
    return session.get(PlanRow, run.plan_id) if session is not None and run.plan_id is not None else None


def owns(plan: PlanRow | None, by: Principal) -> bool:
    """Whether `by` stored the plan (a plan stored before owners were kept has none)."""
    return plan is not None and by.token_id is not None and plan.created_by == by.token_id
