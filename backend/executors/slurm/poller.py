"""The Slurm executor's run side: an approved run becomes one sbatch job (backend/executors/slurm/submit.py makes and
reads
it), and this poller in the API process turns what Slurm says about the job into the run's state (every change
through backend/runs/transitions.py).

| Slurm state                                   | our state                                              |
| --------------------------------------------- | ------------------------------------------------------ |
| PENDING (and CONFIGURING, REQUEUED...)        | queued, with Slurm's reason shown                      |
| RUNNING, COMPLETING                           | running                                                |
| COMPLETED                                     | succeeded                                              |
| FAILED                                        | failed (oom, stopped: as the attempt's outcome record) |
| OUT_OF_MEMORY                                 | oom                                                    |
| CANCELLED                                     | cancelled                                              |
| TIMEOUT, PREEMPTED, NODE_FAIL, BOOT_FAIL, ... | lost; then the next attempt when retries remain        |

A job that Slurm requeues itself (`--requeue`: preemption, node failure, `scontrol requeue`) comes back PENDING
with a higher restart count under the same job id: the attempt is lost and the next one is that same job, which
resumes from the last checkpoint. A job that ended for good (TIMEOUT) gets a new job for the next attempt.

The job id is in the database, so a restarted poller takes up every job where it was. Slurm is read with
`scontrol show job` (it keeps finished jobs for MinJobAge); `sacct` is asked only for a job scontrol no longer
knows (clusters with accounting). Cancel: `scancel --signal=TERM` (the trainer checkpoints), then `scancel`
after the run's stop grace.
"""
from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
from dataclasses import dataclass

from sqlalchemy import and_, or_, select

from backend.core.db import session_scope
from backend.core.logs import tail_lines
from backend.core.settings import Settings, get_settings
from backend.execution import attempt_tokens
from backend.execution.outcome import end_attempt
from backend.executors.slurm.jobscript import render
from backend.executors.slurm.submit import (
    LOST,
    RUNNING,
    SLURM_TIMEOUT_S,
    TRANSIENT,
    WAITING,
    Job,
    job_env,
    job_request,
    read_jobs,
    run_dir_of,
    scancel,
)
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import ACTIVE, TERMINAL, RunState
from plan.launch import stop_grace_s
from plan.outcome import OUTCOME_FILE, STOP_RULES, Cause, Outcome, read_outcome

log = logging.getLogger(__name__)
LOG_TAIL_LINES = 30
ENDED = {"COMPLETED": RunState.SUCCEEDED, "FAILED": RunState.FAILED, "OUT_OF_MEMORY": RunState.OOM,
         "CANCELLED": RunState.CANCELLED}


_submit_lock = threading.Lock()


def submit_if_needed(run_id: int, settings: Settings) -> str | None:
    """sbatch the run's live attempt if it is queued and has no job yet; answers the new job id. Two callers in
    this process (approval and the poller) take turns; a job that loses the race in the database (another API
    process) is cancelled at once."""
    with _submit_lock:
        with session_scope() as s:
            run = s.get(Run, run_id)
            if run is None or run.state != RunState.QUEUED.value or run.slurm_job_id:
                return None
            s.expunge(run)
        run_dir = run_dir_of(run.id, settings)
        run_dir.mkdir(parents=True, exist_ok=True)
        plan_path = run_dir / "plan.json"
        plan_path.write_text(json.dumps(run.spec, indent=1))
        if run.kind == "probe":  # the job runs worker.probe instead of the trainer (worker/slurm_job.py)
            (run_dir / "probe_request.json").write_text(json.dumps(run.probe_request or {}))
        try:
            script = render(job_request(run, settings, plan_path))
        except ValueError as e:  # a setting out of bounds: the run cannot be submitted as it is
            transitions.slurm_refused(run.id, run.attempt, f"cannot make the Slurm job: {e}")
            return None
        script_path = run_dir / f"job-attempt{run.attempt}.sh"
        script_path.write_text(script)
        with session_scope() as s:
            token = attempt_tokens.mint(s, run.id, run.attempt)
        try:
            r = subprocess.run(["sbatch", "--parsable", "--chdir", str(run_dir),
                                "--output", str(run_dir / "slurm-%j.out"), str(script_path)],
                               capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, env=job_env(settings, token))
        except (OSError, subprocess.TimeoutExpired) as e:
            log.warning("run %s: sbatch failed (%s); trying again on the next poll", run.id, e)
            return None
        if r.returncode != 0:
            error = r.stderr.strip()[-500:]
            log.warning("run %s: sbatch refused the job: %s", run.id, error)
            if not any(m in error for m in TRANSIENT):  # else: try again on the next poll
                transitions.slurm_refused(run.id, run.attempt, f"sbatch refused the job: {error}")
            return None
        job_id = r.stdout.strip().split(";")[0]
        if not transitions.slurm_submitted(run.id, run.attempt, job_id):
            scancel(job_id)
            return None
        with session_scope() as s:
            attempt_tokens.bind_job(s, token, job_id)
        log.info("run %s attempt %s: Slurm job %s", run.id, run.attempt, job_id)
        return job_id


def submit(run: Run) -> None:
    """The executor's submit (backend/executors/registry.py): sbatch now; the poller tries again if this fails."""
    submit_if_needed(run.id, get_settings())


# --- the poller -----------------------------------------------------------------------------------------------

@dataclass
class Tracked:
    """A run as the poller sees it (read in one query, acted on without holding a session)."""
    id: int
    state: str
    attempt: int
    job_id: str | None
    slurm_state: str | None
    restarts: int
    cancel_requested: bool
    spec: dict


def tracked_runs() -> list[Tracked]:
    """Slurm runs that are queued or active, and ended runs whose job may still be alive in Slurm."""
    live_jobs = [*WAITING, *RUNNING]
    with session_scope() as s:
        rows = s.scalars(select(Run).where(Run.executor == "slurm", or_(
            Run.state.in_([RunState.QUEUED.value, *(st.value for st in ACTIVE)]),
            and_(Run.slurm_job_id.is_not(None), Run.slurm_state.in_(live_jobs)))).order_by(Run.id))
        return [Tracked(r.id, r.state, r.attempt, r.slurm_job_id, r.slurm_state, r.slurm_restarts,
                        r.cancel_requested, r.spec) for r in rows]


def job_outcome(run_id: int, settings: Settings) -> Outcome | None:
    """The attempt's outcome record, which the job's trainer left in the run directory (plan/outcome.py)."""
    run_dir = run_dir_of(run_id, settings)
    return read_outcome(run_dir, [run_dir / OUTCOME_FILE])


def failure_reason(run_id: int, job: Job, settings: Settings, outcome: Outcome | None) -> str:
    tail = "\n".join(tail_lines(run_dir_of(run_id, settings) / "train.log", LOG_TAIL_LINES))
    said = f": {outcome.message}" if outcome is not None and outcome.message else ""
    return f"Slurm job {job.job_id} {job.state}, exit code {job.exit_code}{said}" + (f":\n{tail}" if tail else "")


class Poller:
    """One poll: submit queued runs without a job, read every tracked job, move runs. Remembers when it sent a
    cancel's SIGTERM (a restarted poller sends it again; the trainer treats a second one like the first)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.term_sent: dict[str, float] = {}

    def poll_once(self) -> None:
        runs = tracked_runs()
        for run in runs:
            if run.state == RunState.QUEUED.value and not run.job_id:
                run.job_id = submit_if_needed(run.id, self.settings)
        ids = [r.job_id for r in runs if r.job_id]
        jobs = read_jobs(ids)
        for run in runs:
            if run.job_id:
                try:
                    self.follow(run, jobs.get(run.job_id))
                except Exception:  # one run's trouble never stops the others
                    log.exception("run %s: could not follow Slurm job %s", run.id, run.job_id)

    def follow(self, run: Tracked, job: Job | None) -> None:
        assert run.job_id
        state = RunState(run.state)
        if job is None:  # neither scontrol nor sacct knows it (purged after MinJobAge, or slurmctld lost it)
            if state == RunState.QUEUED or state in ACTIVE:
                self.lost(run, f"Slurm no longer knows job {run.job_id}", job_ended=True, restarts=run.restarts)
            else:
                transitions.slurm_observed(run.id, run.job_id, "UNKNOWN", None, None)
            return
        if state in TERMINAL:  # cancelled (or reaped) here while the job lives on there: end the job too
            if job.state in WAITING or job.state in RUNNING:
                scancel(job.job_id)
            transitions.slurm_observed(run.id, run.job_id, job.state, job.reason, job.nodes)
            return
        # Slurm requeued the job under us: waiting again, or already running again with a higher restart count
        if state in ACTIVE and (job.restarts > run.restarts or job.state in WAITING):
            if self.lost(run, f"Slurm requeued job {job.job_id} (restart {job.restarts})", job_ended=False,
                         restarts=job.restarts) != "requeued":
                return
            state = RunState.QUEUED
        # waiting; or, for a queued run, a job still winding down (COMPLETING) the attempt Slurm requeued
        if job.state in WAITING or (state == RunState.QUEUED and job.state in RUNNING and job.state != "RUNNING"):
            transitions.slurm_observed(run.id, run.job_id, job.state, job.reason, None)
            return
        if state == RunState.QUEUED:  # the job has nodes (or already ended before a poll saw it run)
            transitions.slurm_started(run.id, run.job_id, job.nodes, str(run_dir_of(run.id, self.settings)),
                                      job.restarts)
        if job.state in RUNNING:
            transitions.slurm_observed(run.id, run.job_id, job.state, None, job.nodes)
            if run.cancel_requested:
                self.cancel(run)
            return
        self.ended(run, job)

    def ended(self, run: Tracked, job: Job) -> None:
        assert run.job_id
        self.term_sent.pop(run.job_id, None)
        if job.state in LOST:
            self.lost(run, f"Slurm job {job.job_id} ended {job.state}", job_ended=True, restarts=job.restarts)
            return
        reason: str | None = "cancelled by request"
        if run.cancel_requested:  # the trainer stopped on our SIGTERM: the job may read FAILED or CANCELLED
            final = RunState.CANCELLED
        else:
            final = ENDED.get(job.state, RunState.FAILED)
            outcome = job_outcome(run.id, self.settings)
            if final == RunState.FAILED and outcome is not None and outcome.exit_code == job.exit_code:
                final = RunState.OOM if outcome.cause == Cause.OOM else \
                    RunState.STOPPED if outcome.cause in STOP_RULES else final
            reason = None if final == RunState.SUCCEEDED else failure_reason(run.id, job, self.settings, outcome)
        job_id = run.job_id  # a probe's result and the calibration point: where every attempt ends (outcome.py)
        if end_attempt(run.id, final, lambda: transitions.slurm_finished(run.id, job_id, final, reason, job.state)):
            log.info("run %s: Slurm job %s %s -> %s", run.id, job.job_id, job.state, final.value)

    def lost(self, run: Tracked, reason: str, job_ended: bool, restarts: int) -> str | None:
        """The attempt is lost. A job Slurm requeued serves the next attempt; an ended one is replaced by a new job
        on the next poll; with no retry left, a requeued job is cancelled."""
        assert run.job_id
        outcome = transitions.slurm_requeued(run.id, run.job_id, reason, restarts, keep_job=not job_ended)
        if outcome == "lost" and not job_ended:
            scancel(run.job_id)
        log.warning("run %s: %s; %s", run.id, reason, outcome)
        return outcome

    def cancel(self, run: Tracked) -> None:
        """SIGTERM to the job's steps (the trainer saves a checkpoint and exits), then scancel after the grace."""
        assert run.job_id
        sent = self.term_sent.get(run.job_id)
        if sent is None:
            scancel(run.job_id, "TERM")
            self.term_sent[run.job_id] = time.monotonic()
            return
        try:
            grace = stop_grace_s(run.spec) + self.settings.cancel_grace_s
        except ValueError:
            grace = self.settings.cancel_grace_s
        if time.monotonic() - sent > grace:
            scancel(run.job_id)


async def poll_forever(settings: Settings) -> None:
    poller = Poller(settings)
    while True:
        try:
            await asyncio.to_thread(poller.poll_once)
        except Exception:  # Slurm or the database may be briefly away; try again next round
            log.exception("Slurm poll failed")
        await asyncio.sleep(settings.slurm_poll_s)
