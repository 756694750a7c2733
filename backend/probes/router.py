"""HTTP: probes -- a probe is a run of the plan (service.py), measured at reduced depth."""
from fastapi import APIRouter

from backend.api.deps import RowId, SessionDep
from backend.auth.deps import Submitter
from backend.plans.schemas import ProbeRequest
from backend.probes.service import submit_probe
from backend.runs.schemas import RunOut

router = APIRouter(prefix="/api/plans", tags=["plans"])


@router.post("/{plan_id}/probe", status_code=202)
def probe_plan(plan_id: RowId, session: SessionDep, user: Submitter, body: ProbeRequest | None = None) -> RunOut:
    """Measure the plan: a probe run (kind "probe") trains it at reduced depths (default 1, 2, 4 layers) with random
    weights on its own GPUs, through the normal queue, and stores the depth line extrapolated to the model's depth
    with the plan (`probe` of GET /api/plans/{id}), beside the planner's figures. 422 naming the field for a plan or
    depth that cannot be probed; 409 when no worker serves the plan's GPU queue."""
    return RunOut.model_validate(submit_probe(session, plan_id, body or ProbeRequest(), user))
