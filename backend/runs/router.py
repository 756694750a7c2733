"""HTTP: runs — submit from a plan, approve, cancel, list, read, log tail."""
from fastapi import APIRouter, Query

from backend.api.deps import Approver, Reader, RowId, SessionDep, Submitter
from backend.runs import service
from backend.runs.schemas import LogOut, RunCreate, RunOut

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.post("", status_code=201)
def create_run(body: RunCreate, session: SessionDep, user: Submitter) -> RunOut:
    """Submit a run from a stored plan; it waits in `pending_approval`. Paths must lie under the allowed roots."""
    return RunOut.model_validate(service.create_run(session, body, user))


@router.get("")
def list_runs(session: SessionDep, _: Reader, state: str | None = Query(None, max_length=200),
              q: str | None = Query(None, max_length=200)) -> list[RunOut]:
    return [RunOut.model_validate(r) for r in service.list_runs(session, state, q)]


@router.get("/{run_id}")
def get_run(run_id: RowId, session: SessionDep, _: Reader) -> RunOut:
    return RunOut.model_validate(service.get_run(session, run_id))


@router.post("/{run_id}/approve")
def approve_run(run_id: RowId, session: SessionDep, user: Approver,
                force: bool = Query(False, description="Approve although the estimate does not fit (recorded).")) -> RunOut:
    """Approve a pending run: it becomes `queued` and its task is sent after the commit. A run whose estimate
    does not fit the GPUs or the nodes' CPU memory is refused (409) unless forced."""
    return RunOut.model_validate(service.approve_run(session, run_id, user, force))


@router.post("/{run_id}/cancel")
def cancel_run(run_id: RowId, session: SessionDep, user: Submitter) -> RunOut:
    """Cancel: at once if not started, else the worker stops the trainer's process group. Submitters may
    cancel their own runs, approvers any."""
    return RunOut.model_validate(service.cancel_run(session, run_id, user))


@router.post("/{run_id}/retry")
def retry_run(run_id: RowId, session: SessionDep, _: Approver) -> RunOut:
    """Queue the next attempt of a failed, oom, cancelled or lost run; it resumes from the last checkpoint."""
    return RunOut.model_validate(service.retry_run(session, run_id))


@router.get("/{run_id}/log")
def run_log(run_id: RowId, session: SessionDep, _: Reader, lines: int = Query(200, ge=1, le=5000)) -> LogOut:
    return LogOut(lines=service.log_tail(service.get_run(session, run_id), lines))
