"""HTTP: the planner (no storage) under /api/estimate and /api/catalog, stored plans under /api/plans."""
from fastapi import APIRouter, Query

from backend import planner
from backend.api.deps import Reader, RowId, SessionDep, Submitter
from backend.plans import service
from backend.plans.schemas import PlanCreate, PlanOut, PlanSpec, SweepRequest

router = APIRouter(prefix="/api", tags=["plans"])


@router.get("/catalog")
def catalog(_: Reader) -> dict:
    """Built-in model presets and GPU types."""
    return planner.catalog()


@router.post("/estimate")
async def estimate(plan: PlanSpec, _: Reader) -> dict:
    """Per-GPU memory and throughput for a plan; an invalid plan answers `valid: false` with its errors."""
    # computed on the event loop: an estimate takes about 0.1 ms, less than a thread-pool hop
    return planner.estimate(plan.as_dict())


@router.post("/estimate/max-seq")
def max_seq(plan: PlanSpec, _: Reader) -> dict:
    """The longest seq_len (a multiple of sp_size) that fits in GPU and CPU memory."""
    return planner.max_seq_len(plan.as_dict())


@router.post("/estimate/sweep")
def sweep(body: SweepRequest, _: Reader) -> dict:
    """Memory and tokens/s over seq_len for several sp_size values, for charts."""
    return planner.sweep(body.plan.as_dict(), body.sp_sizes, body.seq_lens)


@router.post("/estimate/export")
def export(plan: PlanSpec, _: Reader) -> dict:
    """The Accelerate config YAML, DeepSpeed JSON and launch command the trainer would use."""
    service.estimate_or_422(plan.as_dict())
    return planner.exports(plan.as_dict())


@router.post("/plans", status_code=201)
def create_plan(body: PlanCreate, session: SessionDep, _: Submitter) -> PlanOut:
    spec = body.as_dict()
    name = spec.pop("name", "")
    return service.to_out(service.create_plan(session, spec, name))


@router.get("/plans")
def list_plans(session: SessionDep, _: Reader, limit: int = Query(200, ge=1, le=1000)) -> list[PlanOut]:
    return [service.to_out(p) for p in service.list_plans(session, limit)]


@router.get("/plans/{plan_id}")
def get_plan(plan_id: RowId, session: SessionDep, _: Reader) -> PlanOut:
    return service.to_out(service.get_plan(session, plan_id))
