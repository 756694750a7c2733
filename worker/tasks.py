"""The run lifecycle on a worker: claim the run through the seam (backend/execution/agent.py, the service's agent API
over
HTTP; the claim carries the attempt's token, which the shipper presents too), launch the trainer
(`ulab train`, which starts torchrun and the ranks) tagged with the run directory's lock and the attempt, heartbeat,
ship metrics, watch for cancel, stop every process of the attempt, record the exit (worker/supervise.py holds what
the Slurm job shares of this)."""
from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path

from backend.core.settings import Settings, get_settings
from backend.execution.agent import EXECUTE_RUN, Claim, RunState, get_agent, tail_lines
from plan.launch import DATA_PATH_ENV
from plan.model import Plan
from plan.outcome import OUTCOME_ENV, OUTCOME_FILE, STOP_RULES, clear_outcome
from worker import gang, trackers
from worker.celery_app import celery_app
from worker.process import AttemptProcesses, start_group
from worker.shipper import MetricShipper
from worker.supervise import (
    LOG_TAIL_LINES,
    attempt_outcome,
    deliver,
    exit_state,
    failure_reason,
    last_words_file,
    outcome_file,
    stop_wait_s,
    stopped_on_error,
    trainer_command,
    trainer_env,
    watch_and_ship,
)
from worker.trainer.attempt import attempt_tag, lock_file
from worker.trainer.exits import LAST_WORDS_ENV
from worker.trainer.stop_rules import read_stopped

log = logging.getLogger(__name__)


@celery_app.task(name=EXECUTE_RUN, acks_late=True)
def execute_run(run_id: int, node_rank: int = 0) -> str:
    """Run `run_id` (node `node_rank` of it, for multi-node runs) to its end. A delivery that finds the run
    or node already claimed does nothing, so a redelivered message never starts a trainer twice."""
    settings, agent = get_settings(), get_agent()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if node_rank == 0:
        run = agent.claim(run_id, worker)
        if run is None:
            log.info("run %s is not queued (already claimed, cancelled or unknown): nothing to do", run_id)
            return "skipped"
        return supervise(run, settings)
    run = gang.claim_node(run_id, node_rank, worker)
    if run is None:
        log.info("run %s node %s is claimed already or the run is over: nothing to do", run_id, node_rank)
        return "skipped"
    return supervise_node(run, node_rank, settings)


def too_big_for_this_worker(plan: Plan) -> str | None:
    gpus = int(getattr(celery_app.conf, "ulab_gpus", 0) or 0)
    if gpus and plan.hardware.gpus_per_node > gpus:
        return f"the run needs {plan.hardware.gpus_per_node} GPUs per node; this worker has {gpus}"
    return None


def launch(run: Claim, settings: Settings, node_rank: int, rdzv_endpoint: str | None
           ) -> tuple[AttemptProcesses, Path, Path]:
    """Write the plan into the run directory and start this node's trainer; answers (its processes, run_dir,
    log)."""
    run_dir = settings.resolved_runs_dir / f"run-{run.id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"-node{node_rank}" if node_rank else ""
    log_path = run_dir / f"train{suffix}.log"
    plan_path = run_dir / f"plan{suffix}.json"
    plan_path.write_text(json.dumps(run.spec, indent=1))
    try:
        with log_path.open("a") as f:
            f.write(f"--- attempt {run.attempt} on {run.worker if not node_rank else 'node ' + str(node_rank)} ---\n")
    except OSError as e:  # a full disk: the trainer will fail too, and say why in its last words
        log.warning("run %s: could not write %s: %s", run.id, log_path, e)
    lock = lock_file(run_dir, node_rank)
    words, outcome = last_words_file(run.id, run.attempt, node_rank), outcome_file(run.id, run.attempt, node_rank)
    words.unlink(missing_ok=True)
    clear_outcome(run_dir, [run_dir / OUTCOME_FILE, outcome])  # an earlier attempt's record is not this one's
    env = {**trainer_env(os.environ), "PYTHONUNBUFFERED": "1", **attempt_tag(lock, run.attempt),
           LAST_WORDS_ENV: str(words), OUTCOME_ENV: str(outcome)}
    env.pop(DATA_PATH_ENV, None)  # a run of the service trains on its stored plan's data, whatever this host sets
    if rdzv_endpoint:
        env.update(ULAB_RDZV_ENDPOINT=rdzv_endpoint, ULAB_NODE_RANK=str(node_rank),
                   ULAB_RDZV_ID=f"ulab-run{run.id}-attempt{run.attempt}")
    # a probe: the plan at reduced depth (worker/probe.py), every depth in one torchrun launch (probe_ranks.py)
    if run.kind == "probe":
        from worker.probe import probe_command

        cmd = probe_command(plan_path, run_dir, run.probe_request or {})
    else:
        cmd = trainer_command(plan_path, run_dir, run.attempt, run.resume_from)
    proc = start_group(cmd, log_path, env=env)
    log.info("run %s node %s: started trainer pid %s in %s", run.id, node_rank, proc.pid, run_dir)
    return AttemptProcesses(proc, lock, run.attempt), run_dir, log_path


def supervise(run: Claim, settings: Settings) -> str:
    """Node 0 (or the only node): owns the run's state, heartbeat and exit."""
    agent = get_agent()
    reason = too_big_for_this_worker(run.plan)
    if reason:
        deliver(lambda: agent.finish(run.id, run.attempt, RunState.FAILED, reason), settings,
                lambda: agent.heartbeat(run.id, run.attempt, 0), f"run {run.id}: the outcome")
        return RunState.FAILED.value
    endpoint = deliver(lambda: gang.publish_endpoint(run, run.worker or ""), settings,
                       lambda: agent.heartbeat(run.id, run.attempt, 0),
                       f"run {run.id}: the rendezvous endpoint") if run.plan.hardware.num_nodes > 1 else None
    procs, run_dir, log_path = launch(run, settings, 0, endpoint)
    with stopped_on_error(procs, settings):  # the trainer runs on meanwhile: an API restarting now costs no attempt
        deliver(lambda: agent.start(run.id, run.attempt, str(run_dir)), settings,
                lambda: agent.heartbeat(run.id, run.attempt, 0), f"run {run.id}: the start")
        shipper = MetricShipper(run_dir, settings.api_url, run.id, run.token)
    mirror = trackers.forwarder_for(run.id, run.plan, run_dir, settings)  # run.report_to: its own thread
    if mirror is not None:
        mirror.start()  # goes on after the run until every tracker has everything, the final state included

    def beat() -> bool:
        return agent.heartbeat(run.id, run.attempt, shipper.last_step)

    code, stopped, shipped, left = watch_and_ship(procs, shipper, beat, settings, stop_wait_s(run.spec, settings))
    outcome = attempt_outcome(run_dir, code, run.id, run.attempt)
    rule = read_stopped(run_dir, run.attempt) if outcome.cause in STOP_RULES else None
    if rule is not None:  # the same alert row the API raises from the shipped metrics, unless it has already
        deliver(lambda: agent.trainer_stopped(run.id, run.attempt, rule["kind"], int(rule["step"]),
                                              str(rule["message"])), settings, beat, f"run {run.id}: the stop rule")
    log_tail = "\n".join(tail_lines(log_path, LOG_TAIL_LINES))
    last_words_file(run.id, run.attempt, 0).unlink(missing_ok=True)
    outcome_file(run.id, run.attempt, 0).unlink(missing_ok=True)
    state = exit_state(stopped, outcome)
    reason = None if state == RunState.SUCCEEDED else (
        "cancelled by request" if state == RunState.CANCELLED else failure_reason(code, log_tail,
                                                                                  outcome.message or None))
    if not shipped:
        reason = (reason or "") + "\nsome metrics could not be shipped to the API; they remain in the run directory"
    if left:
        reason = (reason or "") + f"\nprocesses {', '.join(map(str, left))} of the run survived SIGKILL"
    # a probe's result and the calibration point are stored where the attempt ends (backend/execution/outcome.py)
    # the run's one outcome record: an API restarting just now must not leave the run to be reaped as lost
    deliver(lambda: agent.finish(run.id, run.attempt, state, reason, last_step=shipper.last_step), settings, beat,
            f"run {run.id}: the outcome")
    log.info("run %s: %s (exit code %s)", run.id, state.value, code)
    return state.value


def supervise_node(run: Claim, node_rank: int, settings: Settings) -> str:
    """Node k > 0 of a multi-node run: wait for node 0's rendezvous endpoint, run this node's ranks, stop
    them when the run ends or is cancelled. Node 0 records the run's outcome."""
    def node_exit(code: int) -> None:
        deliver(lambda: gang.record_node_exit(run.id, run.attempt, node_rank, code), settings,
                lambda: gang.node_heartbeat(run.id, run.attempt, node_rank), f"run {run.id} node {node_rank}: the exit")

    if too_big_for_this_worker(run.plan):
        node_exit(-1)
        return "refused"
    endpoint = gang.wait_for_endpoint(run.id, run.attempt)
    if endpoint is None:
        node_exit(-1)
        return "no rendezvous"
    procs, run_dir, _ = launch(run, settings, node_rank, endpoint)
    # c10d may place global rank 0 (the metrics writer) on any node: every node ships what it finds.
    with stopped_on_error(procs, settings):
        shipper = MetricShipper(run_dir, settings.api_url, run.id, run.token)
    code, _, _, _ = watch_and_ship(procs, shipper, lambda: gang.node_heartbeat(run.id, run.attempt, node_rank),
                                   settings, stop_wait_s(run.spec, settings))
    last_words_file(run.id, run.attempt, node_rank).unlink(missing_ok=True)  # node 0 reports the run's reason
    outcome_file(run.id, run.attempt, node_rank).unlink(missing_ok=True)
    node_exit(code)
    log.info("run %s node %s: exit code %s", run.id, node_rank, code)
    return f"node exit {code}"
