"""HTTP: runs — submit from a plan, approve, cancel, list, read, log tail, share links (backend/runs/share.py)."""
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import ValidationError

import plan as planner
from backend.api.deps import RowId, SessionDep
from backend.auth.deps import Approver, Reader, Submitter
from backend.core.queue import plan_gpu_name
from backend.core.settings import get_settings
from backend.inputs.checkpoint_tar import checkpoint_dir, tar_stream
from backend.runs import service, share
from backend.runs.schemas import (
    CheckpointOut,
    EventOut,
    LogOut,
    RetryIn,
    RunCreate,
    RunLabels,
    RunOut,
    ShareIn,
    ShareListed,
    ShareOut,
    SharesRevoked,
)
from backend.runs.share import RunReader
from backend.runs.states import RunState
from backend.workers import service as workers
from plan.results import Fix

router = APIRouter(prefix="/api/runs", tags=["runs"])


@router.post("", status_code=201)
def create_run(body: RunCreate, session: SessionDep, user: Submitter,
               idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$",
                                                             description="A submit repeated with the same key (by "
                                                                         "the same token) answers the run the first "
                                                                         "made")] = None) -> RunOut:
    """Submit a run from a stored plan; it waits in `pending_approval`. Paths must lie under the allowed roots."""
    return RunOut.model_validate(service.create_run(session, body, user, idempotency_key))


@router.get("")
def list_runs(session: SessionDep, _: Reader, state: str | None = Query(None, max_length=200),
              q: str | None = Query(None, max_length=200),
              tag: str | None = Query(None, max_length=40, description="Only runs with this tag")) -> list[RunOut]:
    return [RunOut.model_validate(r) for r in service.list_runs(session, state, q, tag=tag)]


@router.patch("/{run_id}")
def label_run(run_id: RowId, body: RunLabels, session: SessionDep, user: Submitter) -> RunOut:
    """Set a run's tags and notes (fields left out are kept). As with cancel: submitters label their own runs,
    approvers and admins any (403 otherwise)."""
    return RunOut.model_validate(service.label_run(session, run_id, body, user))


@router.get("/{run_id}")
def get_run(run_id: RowId, session: SessionDep, _: RunReader) -> RunOut:
    """The run; a share link of this run reads it too (backend/runs/share.py)."""
    return RunOut.model_validate(service.get_run(session, run_id))


@router.post("/{run_id}/share", status_code=201)
def share_run(run_id: RowId, session: SessionDep, user: Submitter, request: Request,
              body: ShareIn | None = None) -> ShareOut:
    """A view-only link to the run's page that needs no sign-in: it reads this run only (its plan, state, alerts,
    outcome, timeline and metrics), never another run, a list, a log or a checkpoint, and acts on nothing. The run's
    submitter, an approver or an admin creates it (403 otherwise); the token is shown once."""
    service.require_owner(service.get_run(session, run_id), user, "share")
    row, token = share.create(session, run_id, user, body.days if body else share.DEFAULT_DAYS)
    public = get_settings().public_url
    base = public.rstrip("/") + "/" if public else str(request.base_url)
    url = f"{base}#/runs/{run_id}?{share.QUERY}={token}"
    return ShareOut.model_validate({**ShareListed.model_validate(row).model_dump(), "url": url, "token": token})


@router.get("/{run_id}/share")
def run_shares(run_id: RowId, session: SessionDep, user: Submitter) -> list[ShareListed]:
    """The run's live share links (not revoked, not expired), to whoever may create them."""
    service.require_owner(service.get_run(session, run_id), user, "list the share links of")
    return [ShareListed.model_validate(r) for r in share.live(session, run_id)]


@router.delete("/{run_id}/share")
def unshare_run(run_id: RowId, session: SessionDep, user: Submitter) -> SharesRevoked:
    """Revoke every live share link of the run: from the next request on, they open nothing."""
    service.require_owner(service.get_run(session, run_id), user, "revoke the share links of")
    return SharesRevoked(revoked=share.revoke(session, run_id))


@router.post("/{run_id}/approve")
def approve_run(run_id: RowId, session: SessionDep, user: Approver,
                force: bool = Query(False, description="Approve although the estimate does not fit (recorded).")
                ) -> RunOut:
    """Approve a pending run: it becomes `queued` and its task is sent after the commit. A run whose estimate
    does not fit the GPUs or the nodes' CPU memory is refused (409) unless forced."""
    return RunOut.model_validate(service.approve_run(session, run_id, user, force))


@router.post("/{run_id}/cancel")
def cancel_run(run_id: RowId, session: SessionDep, user: Submitter) -> RunOut:
    """Cancel: at once if not started, else the worker stops the trainer's process group. Submitters may
    cancel their own runs, approvers any."""
    return RunOut.model_validate(service.cancel_run(session, run_id, user))


@router.post("/{run_id}/retry")
def retry_run(run_id: RowId, session: SessionDep, user: Approver, body: RetryIn | None = None) -> RunOut:
    """Queue the next attempt of a failed, oom, cancelled, lost or stopped run; it resumes from the last checkpoint,
    or from `from_checkpoint` ("resume from here"), with `learning_rate` / `lr_scheduler` changed if given (the
    timeline records it). It passes the same gate as approval (backend/runs/gate.py): a run never approved is refused
    (409), as is one whose estimate does not fit unless it was approved anyway, under the cap."""
    return RunOut.model_validate(service.retry_run(
        session, run_id, user, body.from_checkpoint if body else None,
        body.model_dump(include={"learning_rate", "lr_scheduler"}) if body else None))


LogRank = Annotated[int | None, Query(ge=0, le=1_000_000, description="one rank's lines, its [rankN]: prefix off")]
LogLauncher = Annotated[bool, Query(description="only the lines of the launcher (ulab train, torchrun, the worker)")]
LogQuery = Annotated[str | None, Query(max_length=200, description="only lines containing this (any case)")]


@router.get("/{run_id}/log")
def run_log(run_id: RowId, session: SessionDep, _: Reader, lines: int = Query(200, ge=1, le=5000),
            rank: LogRank = None, launcher: LogLauncher = False, q: LogQuery = None) -> LogOut:
    """The end of the run's trainer log: all of it, one rank's lines, or the launcher's; searched with `q`."""
    run = service.get_run(session, run_id)
    return LogOut(lines=service.log_tail(run, lines, rank, launcher, q), ranks=service.world_size(run))


@router.get("/{run_id}/log/download", response_class=PlainTextResponse)
def download_log(run_id: RowId, session: SessionDep, _: Reader, rank: LogRank = None,
                 launcher: LogLauncher = False, q: LogQuery = None) -> PlainTextResponse:
    """The whole trainer log (or one rank's, the launcher's, the lines matching `q`) as a text file."""
    run = service.get_run(session, run_id)
    lines = service.log_tail(run, None, rank, launcher, q)
    part = f"-rank{rank}" if rank is not None else "-launcher" if launcher else ""
    return PlainTextResponse("".join(f"{line}\n" for line in lines), headers={
        "Content-Disposition": f'attachment; filename="run-{run_id}{part}.log"'})


@router.get("/{run_id}/events")
def run_events(run_id: RowId, session: SessionDep, _: RunReader) -> list[EventOut]:
    """The run's timeline, oldest first: submitted, approved, attempts started and ended, alerts."""
    return [EventOut(**e) for e in service.events(service.get_run(session, run_id))]


@router.get("/{run_id}/checkpoints")
def run_checkpoints(run_id: RowId, session: SessionDep, _: Reader) -> list[CheckpointOut]:
    """The run's checkpoints on disk, newest first (Retry resumes from the newest)."""
    return [CheckpointOut(**c) for c in service.checkpoints(service.get_run(session, run_id))]


@router.get("/{run_id}/checkpoints/{name}", response_class=StreamingResponse,
            responses={200: {"content": {"application/x-tar": {}}, "description": "the checkpoint directory"}})
def download_checkpoint(run_id: RowId, name: Annotated[str, Path(min_length=1, max_length=200)],
                        session: SessionDep, _: Reader) -> StreamingResponse:
    """One checkpoint directory as a tar, streamed (`name`: `<stage>-checkpoint-<step>`, as the checkpoints list
    names it); 404 naming a checkpoint that is not there."""
    directory = checkpoint_dir(service.get_run(session, run_id).run_dir, name)
    return StreamingResponse(tar_stream(directory, name), media_type="application/x-tar", headers={
        "Content-Disposition": f'attachment; filename="run-{run_id}-{name}.tar"'})


@router.get("/{run_id}/fix")
def fix_run(run_id: RowId, session: SessionDep, _: Reader) -> Fix:
    """The fewest, cheapest changes to the run's plan that make it fit. For a run that ended `oom` although its
    plan was predicted to fit, the fix leaves room for the planner's error (plan.fix.MEASURED_OOM_MARGIN)."""
    run = service.get_run(session, run_id)
    oom = run.state == RunState.OOM.value
    try:
        plan = run.plan
    except ValidationError:  # a stored plan the current model refuses: the planner's answer names its fields
        return planner.fix(run.spec, measured_oom=oom)  # type: ignore[return-value]
    kernels, liger = workers.queue_offer(session, plan_gpu_name(plan))
    return planner.fix(plan, measured_oom=oom, kernels=kernels, liger=liger)  # type: ignore[return-value]
