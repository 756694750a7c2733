"""Run lifecycle on the API side: create, approve (then enqueue), retry, cancel, list. The database is the truth;
every change of a run's state is a function of backend/runs/transitions.py."""
from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import plan as planner
from backend.auth.roles import Permission, Role
from backend.auth.service import Principal
from backend.core.errors import NotFound, UserError
from backend.core.logs import filter_lines, tail_lines
from backend.core.queue import plan_gpu_name
from backend.core.settings import get_settings
from backend.executors.registry import EXECUTORS, executor_for, executor_name
from backend.inputs import model_source
from backend.inputs.paths import check_run_spec
from backend.plans.models import Plan as PlanRow
from backend.plans.service import get_plan, valid_or_422
from backend.probes.results import tight_without_probe
from backend.runs import gate, transitions
from backend.runs.checkpoint_list import list_checkpoints
from backend.runs.models import Run
from backend.runs.schemas import RunCreate, RunLabels
from backend.runs.states import TERMINAL, IllegalTransition, RunState
from plan.report import default_run_name

log = logging.getLogger(__name__)
TERMINAL_VALUES = frozenset(st.value for st in TERMINAL)


def get_run(session: Session, run_id: int) -> Run:
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound("run", run_id)
    return run


def require_run(session: Session, run_id: int) -> None:
    """404 unless the run exists; reads its key only (the metric routes need no more)."""
    if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
        raise NotFound("run", run_id)


def require_writable_run(session: Session, run_id: int, by: Principal) -> Run:
    """The run, if `by` may write its metrics: 404 unless it exists; 409 if it ended more than
    ULAB_INGEST_AFTER_END_S ago. A worker writes with the token of the attempt it holds
    (backend/execution/attempt_tokens.py:
    live only while that attempt is the run's, so another run or an earlier attempt is refused): 409 for a run not
    started, 403 for another run's token. (An ingest role, an admin importing points, may write a run that has not
    started.)"""
    run = get_run(session, run_id)
    late = get_settings().ingest_after_end_s
    if run.finished_at is not None and run.state in TERMINAL_VALUES and \
            transitions.now() - transitions.as_utc(run.finished_at) > timedelta(seconds=late):
        raise UserError(409, "state", f"run {run_id} ended ({run.state}) more than {late:.0f} s ago: its metrics "
                                      "are closed")
    if by.role != Role.WORKER:
        return run
    if run.state == RunState.PENDING_APPROVAL.value or (run.state == RunState.QUEUED.value and run.attempt == 1):
        raise UserError(409, "state", f"run {run_id} has not started ({run.state}): no worker may write its metrics")
    if by.run_id != run.id:
        raise UserError(403, "authorization", f"this token does not act for run {run_id}'s live attempt: a worker "
                                              "writes the metrics of the attempts it holds only, with their tokens")
    return run


def body_fingerprint(body: RunCreate) -> str:
    """A digest of the whole submit (plan id, run section, name, priority, retries, Slurm overrides)."""
    return hashlib.sha256(json.dumps(body.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def _submitted_with(session: Session, by: Principal, key: str, body: RunCreate) -> Run | None:
    """The run this token submitted with `key`, if any; 409 if that submit was of another plan or another body
    (a run stored before fingerprints were kept is compared by plan only)."""
    run = session.scalar(select(Run).where(Run.submitted_by == by.token_id, Run.idempotency_key == key))
    if run is not None and run.plan_id != body.plan_id:
        raise UserError(409, "idempotency-key", f"this key was used to submit plan {run.plan_id} (run {run.id})")
    if run is not None and run.idempotency_fingerprint not in (None, body_fingerprint(body)):
        raise UserError(409, "idempotency-key", f"this key was used to submit run {run.id} with another request "
                                                "body; a new submit needs a new key")
    return run


def plan_of(session: Session, body: RunCreate, by: Principal) -> PlanRow:
    """The run's stored plan: `plan_id`'s, or `plan` given inline, added to the session so that it is stored with the
    run and only then (the planner's Submit: a refused submit leaves no plan behind)."""
    if (body.plan_id is None) == (body.plan is None):
        raise UserError(422, "plan_id", "give exactly one of plan_id (a stored plan) or plan (the plan itself)")
    if body.plan is None:
        return get_plan(session, body.plan_id or 0)
    if isinstance(body.plan.get("run"), dict):
        raise UserError(422, "plan.run", "the run section goes in `run`, beside the plan")
    plan = valid_or_422(body.plan)
    row = PlanRow(name=body.name, spec=plan.effective(), estimate=planner.estimate(plan), created_by=by.token_id)
    session.add(row)
    session.flush()  # its id, for the run; rolled back with the run when the submit is refused
    return row


def create_run(session: Session, body: RunCreate, by: Principal, idempotency_key: str | None = None) -> Run:
    """The stored plan plus the submitted run section, validated as one plan; stored with every default filled,
    so the trainer runs exactly the plan that was estimated. A repeated Idempotency-Key answers the first run."""
    key = idempotency_key if by.token_id is not None else None
    if key and (earlier := _submitted_with(session, by, key, body)) is not None:
        return earlier
    stored = plan_of(session, body, by)
    settings = get_settings()
    # the stored plan with the submitted run section, validated as one; then a preset plan's run.model_path is
    # filled in from the models root or the hub cache
    plan = valid_or_422({**stored.spec, "run": body.run.model_dump(mode="json")})
    plan = model_source.resolve(plan, settings, strict=False)
    spec = check_run_spec(plan, settings)
    try:
        executor = executor_name(plan, settings)
    except ValueError as e:  # a misconfigured queue: say so instead of queueing a run nothing will take
        raise UserError(422, "hardware.gpu", str(e)) from None
    if not EXECUTORS[executor].placement and (body.slurm_partition or body.slurm_time_limit):
        raise UserError(422, "slurm_partition" if body.slurm_partition else "slurm_time_limit",
                        f"the queue of {plan_gpu_name(plan)} runs on {executor}, not on Slurm")
    # unnamed: "llama-3.1-8b sp8 128K" (the model, layout and context), not "plan 9"
    run = Run(name=body.name or stored.name or default_run_name(spec), plan_id=stored.id, spec=spec,
              estimate=stored.estimate, priority=body.priority, steps=plan.total_steps(),
              submitted_by=by.token_id, max_retries=body.max_retries,  # state: pending_approval (the default)
              executor=executor, slurm_partition=body.slurm_partition, slurm_time_limit=body.slurm_time_limit,
              idempotency_key=key, idempotency_fingerprint=body_fingerprint(body) if key else None)
    session.add(run)
    try:
        session.commit()
    except IntegrityError:  # the same key, submitted at the same moment: the other request made the run
        session.rollback()
        if key and (earlier := _submitted_with(session, by, key, body)) is not None:
            return earlier
        raise
    return run


def approve_run(session: Session, run_id: int, by: Principal, force: bool = False) -> Run:
    """pending_approval -> queued through the gate (gate.check_queue), then the message goes out."""
    run = get_run(session, run_id)
    if run.state != RunState.PENDING_APPROVAL.value:
        raise IllegalTransition(run.state, RunState.QUEUED)
    forced = gate.check_queue(run, by, force)
    if (unprobed := tight_without_probe(session, run)):
        raise UserError(409, "probe", unprobed)
    transitions.approve(run, by.token_id, forced=forced)
    session.commit()  # the message goes out only after the approval is committed
    enqueue(run)
    session.refresh(run)  # the executor may have written to it (the Slurm job id)
    return run


def enqueue(run: Run) -> None:
    """Hand the queued run to its executor (backend/executors/registry.py): Celery workers or one Slurm job."""
    try:
        executor_for(run).submit(run)
    except Exception:  # the run stays queued; the reconciler (Celery) or the Slurm poller sends it again
        log.exception("could not send run %s to its executor", run.id)


CHECKPOINT_REF = re.compile(r"^stage\d{1,4}/checkpoint-\d{1,12}$")  # as worker/trainer/checkpoints.py names one


def retry_run(session: Session, run_id: int, by: Principal, from_checkpoint: str | None = None,
              changes: dict[str, Any] | None = None) -> Run:
    """Queue the next attempt of a run that did not succeed; the worker resumes it from its last checkpoint, or from
    `from_checkpoint` (stage<i>/checkpoint-<step>, one listed by `checkpoints`): the trainer's launcher moves the
    newer ones to RUN_DIR/checkpoints-discarded/attempt-N before its ranks start."""
    run = get_run(session, run_id)
    if from_checkpoint is not None:
        if not CHECKPOINT_REF.match(from_checkpoint):
            raise UserError(422, "from_checkpoint", f"{from_checkpoint[:80]!r} is not stage<i>/checkpoint-<step>")
        on_disk = {f"{c['stage']}/checkpoint-{c['step']}" for c in checkpoints(run) if c["complete"]}
        if from_checkpoint not in on_disk:
            raise UserError(422, "from_checkpoint", f"run {run_id} has no complete checkpoint {from_checkpoint} "
                                                    f"(on disk: {', '.join(sorted(on_disk)) or 'none'})")
    if run.state not in {st.value for st in transitions.RETRYABLE}:
        raise IllegalTransition(run.state, RunState.QUEUED)
    gate.check_queue(run, by)
    said = change_run_section(run, changes or {})
    transitions.queue_retry(run, by.token_id, from_checkpoint)
    if said:  # the run's timeline shows it (events)
        run.changes = [*(run.changes or []), {"at": transitions.now().isoformat(), "attempt": run.attempt,
                                              "message": said}]
    session.commit()
    enqueue(run)
    session.refresh(run)
    return run


def require_owner(run: Run, by: Principal, action: str) -> None:
    """403 unless `by` submitted the run or may act on any run (approver, admin): cancel and label share it."""
    if not by.can(Permission.CANCEL_ANY) and (by.token_id is None or run.submitted_by != by.token_id):
        raise UserError(403, "authorization", f"a submitter may {action} only the runs they submitted")


def change_run_section(run: Run, changes: dict[str, Any]) -> str:
    """Resume with another learning rate or schedule (`run.learning_rate`, `run.lr_scheduler`, and each stage's own):
    the stored spec changes, checked by the plan model; answers what changed ("" for nothing)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    plan = run.plan
    section = plan.run.model_dump(mode="json", exclude_none=True) if plan.run is not None else {}
    said = [f"{k} {section.get(k)} -> {v}" for k, v in changes.items() if section.get(k) != v]
    if not said:
        return ""
    # the run section's JSON, rewritten here before the plan model validates it (and it is stored)
    section.update(changes)
    for stage in section.get("stages") or []:
        stage.update({k: v for k, v in changes.items() if stage.get(k) is not None})
    run.spec = valid_or_422({**plan.effective(), "run": section}).effective()
    return "resumed with " + ", ".join(said)


def cancel_run(session: Session, run_id: int, by: Principal) -> Run:
    run = get_run(session, run_id)
    require_owner(run, by, "cancel")
    transitions.request_cancel(session, run)
    session.commit()
    return run


def label_run(session: Session, run_id: int, labels: RunLabels, by: Principal) -> Run:
    """Set a run's tags and/or notes (not its state: any run, in any state); the owner's or an approver's, as
    cancel."""
    run = get_run(session, run_id)
    require_owner(run, by, "change the tags and notes of")
    if labels.tags is not None:
        run.tags = sorted(set(labels.tags))
    if labels.notes is not None:
        run.notes = labels.notes
    session.commit()
    return run


def list_runs(session: Session, state: str | None = None, q: str | None = None, limit: int = 500,
              tag: str | None = None) -> list[Run]:
    query = select(Run).order_by(Run.id.desc()).limit(limit)
    if state:
        query = query.where(Run.state.in_(state.split(",")))
    if q:
        query = query.where(or_(Run.name.ilike(f"%{q}%"), Run.state.ilike(f"%{q}%")))
    runs = list(session.scalars(query))
    # tags are a JSON list (portable across SQLite and PostgreSQL): filtered here, on at most `limit` rows
    return [r for r in runs if tag in (r.tags or [])] if tag else runs


def checkpoints(run: Run) -> list[dict]:
    """The run's checkpoints on disk, those from before a divergence first (backend/runs/checkpoint_list.py)."""
    return list_checkpoints(run.run_dir)


def world_size(run: Run) -> int:
    """The run's ranks (sp_size x dp_size); 1 for a stored plan this version no longer reads: its log still shows."""
    try:
        return run.plan.world_size
    except ValidationError:
        return 1


def log_tail(run: Run, lines: int | None, rank: int | None = None, launcher: bool = False,
             query: str | None = None) -> list[str]:
    """The last `lines` lines of the run's train.log (None: all), of one rank (its `[rankN]:` prefix taken off) or of
    the launcher, containing `query` if given (backend/core/logs.filter_lines)."""
    if not run.run_dir:
        return []
    path = Path(run.run_dir) / "train.log"
    if rank is None and not launcher and not query and lines is not None:
        return tail_lines(path, lines)  # the live tail: the end of the file only, however long it is
    if rank is not None and rank >= world_size(run):
        raise UserError(422, "rank", f"the run has {world_size(run)} ranks (0..{world_size(run) - 1})")
    return filter_lines(path, rank=rank, launcher=launcher, query=query, limit=lines,
                        one_process=world_size(run) == 1)


def events(run: Run) -> list[dict]:
    """The run's timeline, oldest first: submitted, approved, each attempt's start and end, and the alerts raised
    at metric ingest (backend/alerts/service.py), with the step and whether the rule stopped the run."""
    out: list[dict] = [{"at": run.created_at, "kind": "submitted", "message": run.name or ""}]
    if run.approved_at is not None:
        out.append({"at": run.approved_at, "kind": "approved",
                    "message": "approved past the estimate (forced)" if run.forced else ""})
    ended = {a.attempt for a in run.attempts}
    for a in run.attempts:
        if a.started_at is not None:
            out.append({"at": a.started_at, "kind": "attempt_started", "attempt": a.attempt, "message": a.worker or ""})
        if a.finished_at is not None:
            out.append({"at": a.finished_at, "kind": "attempt_ended", "attempt": a.attempt, "step": a.last_step,
                        "state": a.state, "message": a.exit_reason or ""})
    if run.started_at is not None and run.attempt not in ended:  # the attempt under way
        out.append({"at": run.started_at, "kind": "attempt_started", "attempt": run.attempt,
                    "message": run.worker or ""})
    for alert in run.alerts:
        out.append({"at": alert.created_at, "kind": "alert", "attempt": alert.attempt, "step": alert.step,
                    "message": alert.message, "stopped": alert.stopped})
    for change in run.changes or []:
        out.append({"at": datetime.fromisoformat(change["at"]), "kind": "changed", "attempt": change["attempt"],
                    "message": change["message"]})
    return sorted(out, key=lambda e: transitions.as_utc(e["at"]))
