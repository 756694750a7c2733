"""`ulab job --plan PLAN`: one node of a Slurm run, started by srun from the job script
(backend/executors/slurm/slurm_job.sh.template). It starts this node's `ulab train` ranks, ships metrics to the API and
beats the heartbeat with the Celery worker's own code (worker/supervise.py, worker/shipper.py), and
exits with the trainer's exit code, which becomes the job's (the API's poller reads it from Slurm).

Multi-node: the c10d rendezvous runs on the first host of SLURM_JOB_NODELIST, at ULAB_SLURM_RDZV_PORT plus the
job id modulo 1000 (two jobs sharing a first node get different ports). SIGTERM (a cancel, the time limit's
`--signal`, a requeue) reaches every process of the step through Slurm's process tracking, the trainer's ranks
included, which checkpoint and exit; this process ignores it and ships what they wrote.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from pathlib import Path

from backend.core.settings import get_settings
from backend.execution.agent import get_agent
from plan.outcome import clear_outcome
from worker.probe import REQUEST as PROBE_REQUEST
from worker.probe import probe_command
from worker.process import AttemptProcesses, start_group
from worker.shipper import MetricShipper
from worker.supervise import stop_wait_s, trainer_command, trainer_env, watch_and_ship
from worker.trainer.attempt import attempt_tag, lock_file, previous_attempt
from worker.trainer.exits import EXIT_BAD_INPUT

log = logging.getLogger(__name__)
_GROUP = re.compile(r"^([^\[,]*)\[([^\]]*)\](.*)$")


def split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets: "a[1,2],b" -> ["a[1,2]", "b"]."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def expand_host(item: str) -> list[str]:
    """One entry of a host list: "gpu[01-02]-ib[1,3]" -> gpu01-ib1 gpu01-ib3 gpu02-ib1 gpu02-ib3."""
    m = _GROUP.match(item)
    if not m:
        return [item]
    prefix, ranges, rest = m.groups()
    tails = expand_host(rest) if rest else [""]
    hosts = []
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        hosts += [f"{prefix}{n:0{len(lo)}d}{tail}" for n in range(int(lo), int(hi or lo) + 1) for tail in tails]
    return hosts


def expand_nodelist(nodelist: str) -> list[str]:
    """Slurm's compressed host list in order, as `scontrol show hostnames` prints it:
    "gpu[01-03,07],login1" -> gpu01 gpu02 gpu03 gpu07 login1 (zero padding kept)."""
    return [host for item in split_top_level(nodelist.strip()) for host in expand_host(item)]


def rendezvous_env(env: dict[str, str], run_id: int, port_base: int) -> dict[str, str]:
    """For a job over more than one node: the c10d endpoint on the first node, this node's rank and a rendezvous
    id of this run of the job (a requeued job meets afresh)."""
    nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    if nnodes <= 1:
        return {}
    job_id = int(env["SLURM_JOB_ID"])
    first = expand_nodelist(env["SLURM_JOB_NODELIST"])[0]
    restart = env.get("SLURM_RESTART_COUNT") or "0"
    return {"ULAB_RDZV_ENDPOINT": f"{first}:{port_base + job_id % 1000}", "ULAB_NODE_RANK": env["SLURM_NODEID"],
            "ULAB_RDZV_ID": f"ulab-run{run_id}-job{job_id}-restart{restart}"}


def run_job(plan_path: Path) -> int:
    settings = get_settings()
    env = dict(os.environ)
    try:
        run_id, job_id = int(env["ULAB_JOB_RUN_ID"]), env["SLURM_JOB_ID"]
    except (KeyError, ValueError):
        print("error: `ulab job` runs inside the Slurm job of a run (ULAB_JOB_RUN_ID, SLURM_JOB_ID unset)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    node_rank = int(env.get("SLURM_NODEID") or 0)
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    # a later attempt, or this job run again by Slurm: continue from the newest checkpoint (or step 1 if none)
    resume = int(env.get("ULAB_JOB_ATTEMPT") or 1) > 1 or restart > 0
    run_dir = plan_path.resolve().parent
    env.update(rendezvous_env(env, run_id, settings.slurm_rdzv_port), PYTHONUNBUFFERED="1")
    log_path = run_dir / ("train.log" if node_rank == 0 else f"train-node{node_rank}.log")
    with log_path.open("a") as f:
        f.write(f"--- slurm job {job_id} restart {restart} on {env.get('SLURMD_NODENAME', '?')} "
                f"(node {node_rank}) ---\n")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # see the module's note; the ranks stop on their own SIGTERM
    # Every start of the job on this node (a requeue included) is a new attempt of the run directory's lock: it
    # stops whatever an earlier start left there and writes its own metrics file (worker/trainer/attempt.py).
    attempt = previous_attempt(run_dir, node_rank) + 1
    lock = lock_file(run_dir, node_rank)
    env.update(attempt_tag(lock, attempt))
    # "resume from here" (the job script's ULAB_RESUME_FROM): on the job's first start only; a requeued start goes on
    # from the newest checkpoint, which may be one this job saved after it
    resume_from = env.get("ULAB_RESUME_FROM") if restart == 0 else None
    cmd = trainer_command(plan_path, run_dir, attempt, resume_from, resume=resume)
    if (run_dir / PROBE_REQUEST).exists():  # a run of kind "probe" (backend/executors/slurm/poller.py wrote it)
        cmd = probe_command(plan_path, run_dir, json.loads((run_dir / PROBE_REQUEST).read_text()))
    if node_rank == 0:
        clear_outcome(run_dir)  # an earlier start's record is not this one's
    procs = AttemptProcesses(start_group(cmd, log_path, env=trainer_env(env)), lock, attempt)
    agent = get_agent()
    shipper = MetricShipper(run_dir, settings.api_url, run_id, settings.attempt_token)

    def beat() -> bool:  # cancel reaches the job through scancel, never through the heartbeat
        if node_rank == 0:
            agent.job_heartbeat(run_id, job_id, shipper.last_step)
        return False

    grace = stop_wait_s(json.loads(plan_path.read_text()), settings)
    code, _, shipped, left = watch_and_ship(procs, shipper, beat, settings, grace)
    if not shipped:
        log.warning("run %s: some metrics could not be shipped; they remain in %s", run_id, run_dir)
    if left:
        log.warning("run %s: processes %s survived SIGKILL", run_id, ", ".join(map(str, left)))
    return code  # the attempt's record (RUN_DIR/outcome.json) says why; the API's poller reads it

