"""The Slurm executor: an approved run becomes one sbatch job, and a poller in the API process turns what Slurm
says about the job into the run's state (every change through backend/runs/transitions.py).

| Slurm state                                   | our state                                              |
| --------------------------------------------- | ------------------------------------------------------ |
| PENDING (and CONFIGURING, REQUEUED...)        | queued, with Slurm's reason shown                      |
| RUNNING, COMPLETING                           | running                                                |
| COMPLETED                                     | succeeded                                              |
| FAILED                                        | failed (oom when the trainer exited with its OOM code) |
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
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import and_, or_, select

from backend.core.db import session_scope
from backend.core.logs import tail_lines
from backend.core.queue import queue_for
from backend.core.settings import Settings, get_settings
from backend.executors.base import gpu_name
from backend.executors.jobscript import JobRequest, check_name, check_time, render
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.outcome import end_attempt
from backend.runs.states import ACTIVE, TERMINAL, RunState
from plan.launch import stop_grace_s

log = logging.getLogger(__name__)
EXIT_OOM = 3  # the trainer's exit code for out of memory (worker/trainer/exits.py; backend never imports worker)
LOG_TAIL_LINES = 30
SLURM_TIMEOUT_S = 30.0

WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                     "SUBMITTED"})
# SUSPENDED: the job's processes are stopped, not gone; the run goes on when Slurm resumes them.
RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED"})
ENDED = {"COMPLETED": RunState.SUCCEEDED, "FAILED": RunState.FAILED, "OUT_OF_MEMORY": RunState.OOM,
         "CANCELLED": RunState.CANCELLED}
LOST = frozenset({"TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})


# sbatch errors that say the controller is away, not that the job is wrong.
TRANSIENT = ("Unable to contact slurm controller", "Socket timed out", "Connection refused", "try again")


class SlurmError(RuntimeError):
    pass


def slurm(*args: str) -> str:
    """Run a Slurm command (an argument list, no shell); its stdout, or SlurmError with its stderr."""
    try:
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{args[0]}: {e}") from e
    if r.returncode != 0:
        raise SlurmError(f"{' '.join(args[:2])}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return r.stdout


# --- submit ---------------------------------------------------------------------------------------------------

def queue_setting(settings: Settings, name: str, queue: str) -> str:
    return settings.per_queue(name, queue).strip()


def ulab_path(settings: Settings) -> str:
    return settings.slurm_ulab or str(Path(sys.executable).with_name("ulab"))


def job_request(run: Run, settings: Settings, plan_path: Path) -> JobRequest:
    """The job for the run's live attempt: its nodes and GPUs from the plan, the rest from its GPU queue's
    settings, partition and time limit from the run when it names them."""
    queue = queue_for(gpu_name(run.spec))
    hw = run.spec.get("hardware", {})
    gpus = queue_setting(settings, "slurm_gpus", queue).lower() not in ("false", "0", "no", "")
    grace = stop_grace_s(run.spec) + settings.cancel_grace_s
    return JobRequest(
        run_id=run.id, attempt=run.attempt, nodes=max(1, int(hw.get("num_nodes", 1) or 1)),
        gpus_per_node=int(hw.get("gpus_per_node", 1) or 1) if gpus else 0, grace_s=int(math.ceil(grace)),
        plan=plan_path, ulab=ulab_path(settings), resume_from=run.resume_from or "",
        partition=check_name(run.slurm_partition or queue_setting(settings, "slurm_partition", queue),
                             "slurm_partition"),
        account=check_name(queue_setting(settings, "slurm_account", queue), "slurm_account"),
        qos=check_name(queue_setting(settings, "slurm_qos", queue), "slurm_qos"),
        time_limit=check_time(run.slurm_time_limit or queue_setting(settings, "slurm_time_limit", queue),
                              "slurm_time_limit"))


def run_dir_of(run_id: int, settings: Settings) -> Path:
    return settings.resolved_slurm_shared_dir / f"run-{run_id}"


def job_env(settings: Settings) -> dict[str, str]:
    """The job's environment: the API's (sbatch exports it), with the settings the job needs made absolute, so a
    job started in its run directory reaches the same database and API."""
    return {**os.environ, "ULAB_HOME": str(settings.home.resolve()),
            "ULAB_DATABASE_URL": settings.resolved_database_url, "ULAB_API_URL": settings.api_url,
            "PYTHONUNBUFFERED": "1"}


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
        try:
            r = subprocess.run(["sbatch", "--parsable", "--chdir", str(run_dir),
                                "--output", str(run_dir / "slurm-%j.out"), str(script_path)],
                               capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, env=job_env(settings))
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
        log.info("run %s attempt %s: Slurm job %s", run.id, run.attempt, job_id)
        return job_id


class SlurmExecutor:
    def submit(self, run: Run) -> None:
        submit_if_needed(run.id, get_settings())


# --- read Slurm -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    job_id: str
    state: str
    reason: str
    nodes: str
    exit_code: int
    restarts: int


def parse_scontrol(text: str) -> dict[str, Job]:
    """`scontrol show job -o` (one job a line, Key=Value fields) -> jobs by id."""
    jobs = {}
    for line in text.splitlines():
        fields: dict[str, str] = {m.group(1): m.group(2) for m in re.finditer(r"(\S+?)=(\S*)", line)}
        if "JobId" not in fields:
            continue
        code = fields.get("ExitCode", "0:0").split(":")[0]
        jobs[fields["JobId"]] = Job(
            job_id=fields["JobId"], state=fields.get("JobState", "UNKNOWN").split("+")[0],
            reason=fields.get("Reason", "None"), nodes=fields.get("NodeList", "(null)"),
            exit_code=int(code) if code.isdigit() else 0, restarts=int(fields.get("Restarts", "0") or 0))
    return jobs


def read_jobs(job_ids: list[str]) -> dict[str, Job]:
    """The jobs Slurm knows, with sacct for those scontrol has forgotten (if the cluster keeps accounting)."""
    jobs = parse_scontrol(slurm("scontrol", "show", "job", "-o")) if job_ids else {}
    forgotten = [j for j in job_ids if j not in jobs]
    if forgotten and shutil.which("sacct"):
        try:  # unproven here: the test cluster has no slurmdbd, so sacct answers nothing
            out = slurm("sacct", "-n", "-P", "-X", "-o", "JobID,State,ExitCode,NodeList", "-j", ",".join(forgotten))
        except SlurmError:
            out = ""
        for line in out.splitlines():
            job_id, state, code, nodes = (line.split("|") + ["", "", "", ""])[:4]
            if job_id in forgotten:
                jobs[job_id] = Job(job_id, state.split()[0] if state else "UNKNOWN", "", nodes,
                                   int(code.split(":")[0] or 0), 0)
    return jobs


def scancel(job_id: str, signal: str | None = None) -> None:
    try:
        slurm("scancel", *([f"--signal={signal}"] if signal else []), job_id)
    except SlurmError as e:
        log.warning("scancel %s: %s", job_id, e)


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


def failure_reason(run_id: int, job: Job, settings: Settings) -> str:
    tail = "\n".join(tail_lines(run_dir_of(run_id, settings) / "train.log", LOG_TAIL_LINES))
    return f"Slurm job {job.job_id} {job.state}, exit code {job.exit_code}" + (f":\n{tail}" if tail else "")


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
            if final == RunState.FAILED and job.exit_code == EXIT_OOM:
                final = RunState.OOM
            reason = None if final == RunState.SUCCEEDED else failure_reason(run.id, job, self.settings)
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
