"""HTTP: workers — what each worker reported it can run when it started."""
from fastapi import APIRouter

from backend.api.deps import SessionDep
from backend.auth.deps import Reader
from backend.workers import service
from backend.workers.schemas import WorkerOut

router = APIRouter(prefix="/api/workers", tags=["workers"])


@router.get("")
def workers(session: SessionDep, _: Reader) -> list[WorkerOut]:
    """Every worker that reported: up ones first, then lost, then stopped; its state, library versions, attention
    kernels and GPU model."""
    return [WorkerOut.model_validate({**{c: getattr(w, c) for c in WorkerOut.model_fields if c != "state"},
                                      "state": service.state(w)}) for w in service.list_workers(session)]
