"""HTTP: the planner (no storage) under /api/estimate and /api/catalog, stored plans under /api/plans."""
from typing import Annotated

from fastapi import APIRouter, Query, Response

import plan as planner
from backend.api.deps import RowId, SessionDep
from backend.auth.deps import Reader, Submitter
from backend.core.queue import plan_gpu_name
from backend.plans import service
from backend.plans.schemas import (
    PlanCreate,
    PlanDefaults,
    PlanImport,
    PlanImported,
    PlanOut,
    RecommendRequest,
    SweepRequest,
)
from backend.workers import service as workers
from plan import Plan
from plan.cost import TrainTokens
from plan.model import EXAMPLE, field_choices, section_defaults
from plan.results import Catalog, Estimate, Exports, Fix, MaxSeq, Recommend, SpMethods, Sweep

router = APIRouter(prefix="/api", tags=["plans"])


@router.get("/catalog")
def catalog(_: Reader) -> Catalog:
    """Built-in model presets and GPU types."""
    return Catalog.model_validate(planner.catalog.listing())


@router.post("/estimate")
async def estimate(plan: Plan, _: Reader, train_tokens: Annotated[TrainTokens | None, Query()] = None) -> Estimate:
    """Per-GPU memory and throughput for a plan; a plan that breaks a rule answers `valid: false` with its errors
    (a field of the wrong type or an unknown key is a 422). With `train_tokens` (or a `run` section), `cost`: the
    wall time and GPU-hours of the run."""
    # computed on the event loop: an estimate takes about 0.1 ms, less than a thread-pool hop
    return planner.estimate(plan, train_tokens)  # type: ignore[return-value]  # validated as Estimate on the way out


@router.post("/estimate/max-seq")
def max_seq(plan: Plan, _: Reader) -> MaxSeq:
    """The longest seq_len (a multiple of sp_size) that fits in GPU and CPU memory."""
    return planner.max_seq_len(plan)  # type: ignore[return-value]


@router.post("/estimate/sweep")
def sweep(body: SweepRequest, _: Reader) -> Sweep:
    """Memory and tokens/s over seq_len for several sp_size values, for charts."""
    return planner.sweep(body.plan, body.sp_sizes, body.seq_lens)  # type: ignore[return-value]


@router.post("/estimate/recommend")
def recommend(body: RecommendRequest, session: SessionDep, _: Reader) -> Recommend:
    """The configurations that fit the plan's model and hardware at its seq_len (or, with `longest`, the longest
    seq_len), best first, each with its reasons, and the nearest rejected ones. Training and parallel fields the
    plan sets (seq_len aside) are kept; the rest are searched. Only the attention kernels the live workers of the
    plan's queue report (`queue_kernels`) come first; an option needing another comes after, saying so; Liger is
    proposed only where a worker has it. Every option trains the same global batch (grad_accum adjusted) unless
    `vary_global_batch`."""
    kernels, liger = workers.queue_offer(session, plan_gpu_name(body.plan))
    return planner.recommend(body.plan, longest=body.longest, kernels=kernels,  # type: ignore[return-value]
                             liger=liger, train_tokens=body.train_tokens, vary_batch=body.vary_global_batch,
                             global_batch=body.global_batch)


@router.post("/estimate/fix")
def fix(plan: Plan, session: SessionDep, _: Reader) -> Fix:
    """The fewest changes that make a plan fit (empty when it fits), cheapest speed cost first; a plan asking an
    attention kernel no live worker of its queue has is moved to one it has, and Liger is proposed only where a
    worker has it."""
    kernels, liger = workers.queue_offer(session, plan_gpu_name(plan))
    return planner.fix(plan, kernels=kernels, liger=liger)  # type: ignore[return-value]


@router.post("/estimate/sp-methods")
def sp_methods(plan: Plan, _: Reader) -> SpMethods:
    """Ulysses vs ring attention vs a Ulysses x ring hybrid for the plan: memory, communication, step time (an
    estimate: Ulysses Lab trains with Ulysses)."""
    return planner.compare_sp_methods(plan)  # type: ignore[return-value]


@router.post("/estimate/export")
def export(plan: Plan, _: Reader) -> Exports:
    """The Accelerate config YAML, DeepSpeed JSON and launch command the trainer would use (422 if invalid)."""
    service.valid_or_422(plan)
    return planner.exports(plan)  # type: ignore[return-value]


@router.post("/estimate/export.zip", response_class=Response,
             responses={200: {"content": {"application/zip": {}}, "description": "Every exported file"}})
def export_zip(plan: Plan, _: Reader) -> Response:
    """Every file of the plan's run for every node in one zip (plan.json with its run section, the DeepSpeed JSON,
    training_args.json, one Accelerate YAML and one torchrun script per node, the sbatch script, a README). A plan
    with no `run` section is a 422 naming it: the trainer needs steps, learning_rate and data."""
    return Response(service.export_zip(plan), media_type="application/zip",
                    headers={"Content-Disposition": 'attachment; filename="ulysses-lab-plan.zip"'})


@router.get("/plans/defaults")
def plan_defaults(_: Reader) -> PlanDefaults:
    """The plan a new form starts from, with every default filled in, and each section's defaults."""
    return PlanDefaults(plan=Plan.model_validate(EXAMPLE).effective(), defaults=section_defaults(),
                        choices=field_choices())


@router.post("/plans/effective")
def effective_plan(plan: Plan, _: Reader) -> dict:
    """The plan with every default filled in, as `ulab plan --effective` prints it (422 if it breaks a rule)."""
    return service.valid_or_422(plan).effective()


@router.post("/plans/import")
def import_plan(body: PlanImport, _: Reader) -> PlanImported:
    """The plan a DeepSpeed config, launch line, Accelerate config or TrainingArguments describe, estimated at once:
    keys none of DeepSpeed, Accelerate and the Trainer reads are `warnings` (each saying what does the job instead),
    contradictions are `errors` naming both sides, "auto" and unset values are `defaults` with the value they take.
    Text that does not parse is a 422 naming its line. Nothing is stored."""
    return service.import_setup(body)  # type: ignore[return-value]  # validated against PlanImported on the way out


@router.post("/plans", status_code=201)
def create_plan(body: PlanCreate, session: SessionDep, user: Submitter) -> PlanOut:
    """Store a plan (every default filled in) with its estimate; a plan that breaks a rule is a 422."""
    return service.to_out(service.create_plan(session, Plan.model_validate(body.plan_data()), body.name,
                                              by=user.token_id))


@router.get("/plans")
def list_plans(session: SessionDep, _: Reader, limit: int = Query(200, ge=1, le=1000)) -> list[PlanOut]:
    return [service.to_out(p) for p in service.list_plans(session, limit)]


@router.get("/plans/{plan_id}")
def get_plan(plan_id: RowId, session: SessionDep, _: Reader) -> PlanOut:
    return service.to_out(service.get_plan(session, plan_id))

