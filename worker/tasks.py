"""The run lifecycle on a worker: claim in the database, launch the trainer under torchrun in its own process
group, heartbeat, ship metrics, watch for cancel, record the exit."""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import update

from backend.core.db import session_scope
from backend.core.settings import get_settings
from backend.runs.models import Run
from backend.runs.service import now
from backend.runs.attempts import record_attempt
from backend.runs.states import ACTIVE, TERMINAL, RunState, check_transition
from worker import gang
from worker.celery_app import EXECUTE_RUN, celery_app
from worker.process import start_group, stop_group
from worker.shipper import MetricShipper
from worker.trainer.cli import EXIT_OOM

log = logging.getLogger(__name__)
TICK_S = 0.5
LOG_TAIL_LINES = 30


_minted_token: str | None = None


def worker_token() -> str:
    """ULAB_WORKER_TOKEN, or a worker-role token this worker mints in the database once (it has DB access)."""
    global _minted_token
    settings = get_settings()
    if settings.worker_token:
        return settings.worker_token
    if _minted_token is None:
        from backend.auth.roles import Role
        from backend.auth.service import create_token

        with session_scope() as s:
            _, _minted_token = create_token(s, f"worker {socket.gethostname()}:{os.getpid()}", Role.WORKER)
    return _minted_token


def claim(run_id: int, worker: str) -> Run | None:
    """Atomically move a queued run to `starting` for this worker; None if someone else has it (or it left)."""
    with session_scope() as s:
        res = s.execute(update(Run).where(Run.id == run_id, Run.state == RunState.QUEUED.value)
                        .values(state=RunState.STARTING.value, worker=worker, started_at=now(), heartbeat_at=now()))
        if res.rowcount != 1:
            return None
        return s.get(Run, run_id)


def set_state(run_id: int, attempt: int, state: RunState, **fields) -> bool:
    """Move this attempt of the run to `state`; False (and nothing changes) if the attempt is no longer the
    run's live one (the reaper marked it lost and maybe queued the next attempt)."""
    with session_scope() as s:
        run = s.get(Run, run_id)
        if run.attempt != attempt or RunState(run.state) not in ACTIVE:
            log.warning("run %s attempt %s: now %s (attempt %s); not recording %s", run_id, attempt, run.state,
                        run.attempt, state.value)
            return False
        check_transition(run.state, state)
        run.state = state.value
        for k, v in fields.items():
            setattr(run, k, v)
        if state in TERMINAL:
            record_attempt(s, run)
        return True


def heartbeat(run_id: int, attempt: int, last_step: int) -> bool:
    """Record that the attempt is alive; answers whether it must stop (cancel requested, or the run was
    declared lost and is no longer this attempt's)."""
    with session_scope() as s:
        run = s.get(Run, run_id)
        if run.attempt != attempt or RunState(run.state) not in ACTIVE:
            return True
        run.heartbeat_at = now()
        run.last_step = max(run.last_step, last_step)
        return bool(run.cancel_requested)


def tail(path: Path, lines: int) -> str:
    if not path.is_file():
        return ""
    with path.open("rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - 200 * lines))
        return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])


def exit_state(code: int, cancelled: bool, log_tail: str) -> RunState:
    if cancelled:
        return RunState.CANCELLED
    if code == 0:
        return RunState.SUCCEEDED
    return RunState.OOM if code == EXIT_OOM or "out of memory" in log_tail.lower() else RunState.FAILED


@celery_app.task(name=EXECUTE_RUN, acks_late=True)
def execute_run(run_id: int, node_rank: int = 0) -> str:
    """Run `run_id` (node `node_rank` of it, for multi-node runs) to its end. A delivery that finds the run
    or node already claimed does nothing, so a redelivered message never starts a trainer twice."""
    settings = get_settings()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if node_rank == 0:
        run = claim(run_id, worker)
        if run is None:
            log.info("run %s is not queued (already claimed, cancelled or unknown): nothing to do", run_id)
            return "skipped"
        return supervise(run, settings)
    run = gang.claim_node(run_id, node_rank, worker)
    if run is None:
        log.info("run %s node %s is claimed already or the run is over: nothing to do", run_id, node_rank)
        return "skipped"
    return supervise_node(run, node_rank, settings)


def trainer_command(plan_path: Path, run_dir: Path, attempt: int) -> list[str]:
    """`ulab train` as an argument list (no shell): it checks the plan and data first, then starts torchrun
    with one process per rank in its own process group. Later attempts resume from the last checkpoint."""
    cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir)]
    if attempt > 1:  # the trainer resumes from its newest checkpoint, or starts at step 1 if it has none
        cmd.append("--resume")
    return cmd


def ranks_needed(spec: dict) -> int:
    return max(1, int(spec["hardware"].get("gpus_per_node", 1)))


def too_big_for_this_worker(spec: dict) -> str | None:
    gpus = int(getattr(celery_app.conf, "ulab_gpus", 0) or 0)
    if gpus and ranks_needed(spec) > gpus:
        return f"the run needs {ranks_needed(spec)} GPUs per node; this worker has {gpus}"
    return None


def launch(run: Run, settings, node_rank: int, rdzv_endpoint: str | None):
    """Write the plan into the run directory and start this node's trainer; answers (process, run_dir, log)."""
    run_dir = settings.resolved_runs_dir / f"run-{run.id}"
    run_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"-node{node_rank}" if node_rank else ""
    log_path = run_dir / f"train{suffix}.log"
    plan_path = run_dir / f"plan{suffix}.json"
    plan_path.write_text(json.dumps(run.spec, indent=1))
    with log_path.open("a") as f:
        f.write(f"--- attempt {run.attempt} on {run.worker if not node_rank else 'node ' + str(node_rank)} ---\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if rdzv_endpoint:
        env.update(ULAB_RDZV_ENDPOINT=rdzv_endpoint, ULAB_NODE_RANK=str(node_rank),
                   ULAB_RDZV_ID=f"ulab-run{run.id}-attempt{run.attempt}")
    proc = start_group(trainer_command(plan_path, run_dir, run.attempt), log_path, env=env)
    log.info("run %s node %s: started trainer pid %s in %s", run.id, node_rank, proc.pid, run_dir)
    return proc, run_dir, log_path


class Heartbeat:
    """Calls `beat()` every `every_s` seconds in its own thread, so nothing on the watch loop (a slow or absent
    API while shipping metrics, the grace period of a stop) can delay it past the reaper's limit.
    `beat()` answers whether the run must stop; `stop_requested` is set the first time it says so."""

    def __init__(self, beat, every_s: float):
        self.beat, self.every_s = beat, every_s
        self.stop_requested = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def _loop(self) -> None:
        while True:
            try:
                if self.beat():
                    self.stop_requested.set()
            except Exception:  # the database may be briefly away: keep beating, the next round may get through
                log.exception("heartbeat failed")
            if self._done.wait(self.every_s):
                return

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=30)


def watch(proc, shipper: MetricShipper, beat: Heartbeat, settings) -> tuple[int, bool]:
    """Ship metrics until the trainer exits; stop the trainer's group when the heartbeat learns the run must
    stop. Answers (exit code, whether it was stopped)."""
    stopped = False
    try:
        while proc.poll() is None:
            shipper.ship()
            if beat.stop_requested.is_set() and not stopped:
                stopped = True
                stop_group(proc, settings.cancel_grace_s)
            time.sleep(TICK_S)
        return proc.returncode, stopped
    except BaseException:
        stop_group(proc, settings.cancel_grace_s)  # the worker is going down: never orphan the ranks
        raise


def watch_and_ship(proc, shipper: MetricShipper, beat_fn, settings) -> tuple[int, bool, bool]:
    """Beat (in its own thread) from launch until the last metrics are shipped: watch the trainer, then drain
    what it wrote, since the API may still be away when it exits. Answers (exit code, whether it was stopped,
    whether everything was shipped)."""
    with Heartbeat(beat_fn, settings.heartbeat_s) as beat:
        try:
            code, stopped = watch(proc, shipper, beat, settings)
        finally:
            shipped = shipper.drain(deadline_s=60.0)
            shipper.close()
    return code, stopped, shipped


def supervise(run: Run, settings) -> str:
    """Node 0 (or the only node): owns the run's state, heartbeat and exit."""
    reason = too_big_for_this_worker(run.spec)
    if reason:
        set_state(run.id, run.attempt, RunState.FAILED, finished_at=now(), exit_reason=reason)
        return RunState.FAILED.value
    endpoint = gang.publish_endpoint(run, run.worker) if gang.num_nodes(run.spec) > 1 else None
    proc, run_dir, log_path = launch(run, settings, 0, endpoint)
    set_state(run.id, run.attempt, RunState.RUNNING, run_dir=str(run_dir))
    shipper = MetricShipper(run_dir / "metrics.jsonl", settings.api_url, run.id, worker_token())
    code, stopped, shipped = watch_and_ship(proc, shipper, lambda: heartbeat(run.id, run.attempt, shipper.last_step),
                                            settings)
    log_tail = tail(log_path, LOG_TAIL_LINES)
    state = exit_state(code, stopped, log_tail)
    reason = None if state == RunState.SUCCEEDED else (
        "cancelled by request" if state == RunState.CANCELLED else f"exit code {code}:\n{log_tail}")
    if not shipped:
        reason = (reason or "") + "\nsome metrics could not be shipped to the API; they remain in metrics.jsonl"
    set_state(run.id, run.attempt, state, finished_at=now(), exit_reason=reason, last_step=shipper.last_step,
              heartbeat_at=now())
    log.info("run %s: %s (exit code %s)", run.id, state.value, code)
    return state.value


def supervise_node(run: Run, node_rank: int, settings) -> str:
    """Node k > 0 of a multi-node run: wait for node 0's rendezvous endpoint, run this node's ranks, stop
    them when the run ends or is cancelled. Node 0 records the run's outcome."""
    if too_big_for_this_worker(run.spec):
        gang.record_node_exit(run.id, run.attempt, node_rank, -1)
        return "refused"
    endpoint = gang.wait_for_endpoint(run.id, run.attempt)
    if endpoint is None:
        gang.record_node_exit(run.id, run.attempt, node_rank, -1)
        return "no rendezvous"
    proc, run_dir, _ = launch(run, settings, node_rank, endpoint)
    # c10d may place global rank 0 (the metrics writer) on any node: every node ships what it finds.
    shipper = MetricShipper(run_dir / "metrics.jsonl", settings.api_url, run.id, worker_token())
    code, _, _ = watch_and_ship(proc, shipper, lambda: gang.node_heartbeat(run.id, run.attempt, node_rank), settings)
    gang.record_node_exit(run.id, run.attempt, node_rank, code)
    log.info("run %s node %s: exit code %s", run.id, node_rank, code)
    return f"node exit {code}"
