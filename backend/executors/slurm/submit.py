"""The Slurm side of the Slurm executor: the job of a run's attempt (its resources from the plan and the queue's
settings, backend/executors/slurm/jobscript.py renders the script), and reading and cancelling jobs (`scontrol`,
`sacct`,
`scancel`). It knows no database: backend/executors/slurm/poller.py submits runs' jobs and turns what Slurm says about
them into the runs' states.
"""
from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from backend.core.queue import plan_gpu_name, queue_for
from backend.core.settings import Settings
from backend.executors.slurm.jobscript import JobRequest, check_name, check_time
from plan.launch import stop_grace_s
from plan.model import Plan

log = logging.getLogger(__name__)
SLURM_TIMEOUT_S = 30.0

WAITING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                     "SUBMITTED"})
# SUSPENDED: the job's processes are stopped, not gone; the run goes on when Slurm resumes them.
RUNNING = frozenset({"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING", "SUSPENDED"})
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


class SlurmRun(Protocol):
    """What the job of a run's attempt is made from (a run row of backend/runs/models.py)."""

    @property
    def id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def spec(self) -> dict: ...
    @property
    def plan(self) -> Plan: ...
    @property
    def resume_from(self) -> str | None: ...
    @property
    def slurm_partition(self) -> str | None: ...
    @property
    def slurm_time_limit(self) -> str | None: ...


def job_request(run: SlurmRun, settings: Settings, plan_path: Path) -> JobRequest:
    """The job for the run's live attempt: its nodes and GPUs from the plan, the rest from its GPU queue's
    settings, partition and time limit from the run when it names them."""
    queue = queue_for(plan_gpu_name(run.plan))
    hw = run.plan.hardware
    gpus = queue_setting(settings, "slurm_gpus", queue).lower() not in ("false", "0", "no", "")
    grace = stop_grace_s(run.plan) + settings.cancel_grace_s
    return JobRequest(
        run_id=run.id, attempt=run.attempt, nodes=hw.num_nodes,
        gpus_per_node=hw.gpus_per_node if gpus else 0, grace_s=int(math.ceil(grace)),
        plan=plan_path, ulab=ulab_path(settings), resume_from=run.resume_from or "",
        partition=check_name(run.slurm_partition or queue_setting(settings, "slurm_partition", queue),
                             "slurm_partition"),
        account=check_name(queue_setting(settings, "slurm_account", queue), "slurm_account"),
        qos=check_name(queue_setting(settings, "slurm_qos", queue), "slurm_qos"),
        time_limit=check_time(run.slurm_time_limit or queue_setting(settings, "slurm_time_limit", queue),
                              "slurm_time_limit"))


def run_dir_of(run_id: int, settings: Settings) -> Path:
    return settings.resolved_slurm_shared_dir / f"run-{run_id}"


# The service's own credentials, which a job never gets: it reaches the service over HTTP with its attempt's token.
SERVICE_SECRETS = ("ULAB_DATABASE_URL", "ULAB_BROKER_URL", "ULAB_REDIS_PASSWORD", "ULAB_WORKER_TOKEN")


def job_env(settings: Settings, attempt_token: str) -> dict[str, str]:
    """The job's environment: the API's (sbatch exports it) without the service's credentials, with the settings the
    job needs made absolute, so a job started in its run directory reaches the same API, and its attempt's token."""
    return {**{k: v for k, v in os.environ.items() if k not in SERVICE_SECRETS},
            "ULAB_HOME": str(settings.home.resolve()), "ULAB_API_URL": settings.api_url,
            "ULAB_ATTEMPT_TOKEN": attempt_token, "PYTHONUNBUFFERED": "1"}


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
