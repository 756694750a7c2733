"""The run lifecycle on a worker: claim in the database, launch the trainer (`ulab train`, which starts torchrun
and the ranks) tagged with the run directory's lock and the attempt, heartbeat, ship metrics, watch for cancel,
stop every process of the attempt, record the exit."""
from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from backend.core.db import session_scope
from backend.core.logs import tail_lines
from backend.core.queue import EXECUTE_RUN
from backend.core.settings import get_settings
from backend.metrics import alerts
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import RunState
from plan.launch import stop_grace_s
from worker import gang, trackers
from worker.celery_app import celery_app
from worker.process import AttemptProcesses, start_group
from worker.shipper import MetricShipper
from worker.trainer.attempt import attempt_tag, lock_file
from worker.trainer.exits import (
    EXIT_OOM,
    EXIT_STOPPED,
    LAST_WORDS_ENV,
    attempt_lines,
    describe_exit,
    known_cause,
    says_out_of_memory,
)
from worker.trainer.guard import read_stopped

log = logging.getLogger(__name__)
TICK_S = 0.5
LOG_TAIL_LINES = 30


_token: tuple[str, int | None] | None = None


def worker_credentials() -> tuple[str, int | None]:
    """The token this worker ships metrics with and its id, recorded when it claims a run (only that token may then
    write the run's metrics): ULAB_WORKER_TOKEN, else the worker token kept under ULAB_HOME and reused by every
    start of a worker there (backend/auth/service.py), so restarts do not pile up live tokens."""
    global _token
    if _token is None:
        from backend.auth.service import worker_token as kept_token

        with session_scope() as s:
            token, principal = kept_token(s, get_settings())
        _token = token, principal.token_id if principal is not None else None
    return _token


def worker_token() -> str:
    return worker_credentials()[0]


def exit_state(code: int, cancelled: bool, log_tail: str) -> RunState:
    if cancelled:
        return RunState.CANCELLED
    if code == 0:
        return RunState.SUCCEEDED
    if code == EXIT_STOPPED:  # the trainer stopped itself on a stop rule (worker/trainer/guard.py)
        return RunState.STOPPED
    return RunState.OOM if code == EXIT_OOM or says_out_of_memory(log_tail) else RunState.FAILED


@celery_app.task(name=EXECUTE_RUN, acks_late=True)
def execute_run(run_id: int, node_rank: int = 0) -> str:
    """Run `run_id` (node `node_rank` of it, for multi-node runs) to its end. A delivery that finds the run
    or node already claimed does nothing, so a redelivered message never starts a trainer twice."""
    settings = get_settings()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    if node_rank == 0:
        run = transitions.claim(run_id, worker, token_id=worker_credentials()[1])
        if run is None:
            log.info("run %s is not queued (already claimed, cancelled or unknown): nothing to do", run_id)
            return "skipped"
        return supervise(run, settings)
    run = gang.claim_node(run_id, node_rank, worker, token_id=worker_credentials()[1])
    if run is None:
        log.info("run %s node %s is claimed already or the run is over: nothing to do", run_id, node_rank)
        return "skipped"
    return supervise_node(run, node_rank, settings)


def trainer_command(plan_path: Path, run_dir: Path, attempt: int, resume_from: str | None = None) -> list[str]:
    """`ulab train` as an argument list (no shell): it takes the run directory's lock for this attempt, checks
    the plan and data, then starts torchrun with one process per rank. Later attempts resume from the last
    checkpoint, or from `resume_from` (the run's "resume from here": the newer checkpoints are moved aside)."""
    cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir),
           "--attempt", str(attempt)]
    if attempt > 1:  # the trainer resumes from its newest checkpoint, or starts at step 1 if it has none
        cmd.append("--resume")
        if resume_from:
            cmd += ["--resume-from", resume_from]
    return cmd


def ranks_needed(spec: dict) -> int:
    return max(1, int(spec["hardware"].get("gpus_per_node", 1)))


def too_big_for_this_worker(spec: dict) -> str | None:
    gpus = int(getattr(celery_app.conf, "ulab_gpus", 0) or 0)
    if gpus and ranks_needed(spec) > gpus:
        return f"the run needs {ranks_needed(spec)} GPUs per node; this worker has {gpus}"
    return None


def launch(run: Run, settings, node_rank: int, rdzv_endpoint: str | None):
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
    words = last_words_file(run.id, run.attempt, node_rank)
    words.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **attempt_tag(lock, run.attempt), LAST_WORDS_ENV: str(words)}
    if rdzv_endpoint:
        env.update(ULAB_RDZV_ENDPOINT=rdzv_endpoint, ULAB_NODE_RANK=str(node_rank),
                   ULAB_RDZV_ID=f"ulab-run{run.id}-attempt{run.attempt}")
    if run.kind == "probe":  # the plan at reduced depth (worker/probe.py), each depth a `ulab train` of its own
        from worker.probe import probe_command

        cmd = probe_command(plan_path, run_dir, run.probe_request)
    else:
        cmd = trainer_command(plan_path, run_dir, run.attempt, run.resume_from)
    proc = start_group(cmd, log_path, env=env)
    log.info("run %s node %s: started trainer pid %s in %s", run.id, node_rank, proc.pid, run_dir)
    return AttemptProcesses(proc, lock, run.attempt), run_dir, log_path


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

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=30)


def stop_wait_s(spec: dict, settings) -> float:
    """How long the worker waits between SIGTERM and SIGKILL of an attempt's processes: the plan's stop grace
    (what the ranks have to save a checkpoint; torchrun gets the same) plus ULAB_CANCEL_GRACE_S for torchrun and
    `ulab train` to exit after it (the whole timeline: plan/launch.py, above TORCHRUN_EXIT_S)."""
    try:
        return stop_grace_s(spec) + settings.cancel_grace_s
    except ValueError:  # a stored plan this version no longer reads: the trainer refuses it at once anyway
        return settings.cancel_grace_s


def watch(procs: AttemptProcesses, shipper: MetricShipper, beat: Heartbeat, grace_s: float
          ) -> tuple[int, bool, list[int]]:
    """Ship metrics until the trainer exits, recording its processes as they appear; stop them all when the
    heartbeat learns the run must stop. Once `ulab train` has exited (also when it was killed), wait for what
    it left, kill it after the grace period and verify. Answers (exit code, whether it was stopped, pids that
    survived SIGKILL)."""
    stopped, proc = False, procs.proc
    try:
        while proc.poll() is None:
            procs.refresh()
            shipper.ship()
            if beat.stop_requested.is_set() and not stopped:
                stopped = True
                procs.stop(grace_s)
            time.sleep(TICK_S)
        return proc.returncode, stopped, procs.finish(grace_s)
    except BaseException:
        procs.stop(grace_s)  # the worker is going down: never orphan the ranks
        raise


def watch_and_ship(procs: AttemptProcesses, shipper: MetricShipper, beat_fn, settings, grace_s: float
                   ) -> tuple[int, bool, bool, list[int]]:
    """Beat (in its own thread) from launch until the last metrics are shipped: watch the trainer, then drain
    what it wrote, since the API may still be away when it exits. Answers (exit code, whether it was stopped,
    whether everything was shipped, pids that survived SIGKILL)."""
    with Heartbeat(beat_fn, settings.heartbeat_s) as beat:
        try:
            code, stopped, left = watch(procs, shipper, beat, grace_s)
        finally:
            shipped = shipper.drain(deadline_s=60.0)
            shipper.close()
    return code, stopped, shipped, left


@contextmanager
def stopped_on_error(procs: AttemptProcesses, settings):
    """Between launch and the watch loop: if anything fails (the database briefly away, say), stop the trainer
    and all it started before the error goes on, or it trains on as an orphan (the worker lives on, so no
    PDEATHSIG)."""
    try:
        yield
    except BaseException:
        procs.stop(settings.cancel_grace_s)
        raise


# torchrun's failure summary: "  rank      : 1 (local_rank: 1)" ... "  exitcode  : -9 (pid: 4242)"
_TORCHRUN_FAILURE = re.compile(r"^\s*rank\s*:\s*(\d+).*\n(?:.*\n){0,3}?\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE)
# a Python warning ("file.py:12: FutureWarning: ...") and the source line printed under it
_WARNING = re.compile(r"^.*\b\w*Warning: .*$\n?(?:^(?:\[rank\d+\]: )? {2,}\S.*$\n?)?", re.MULTILINE)


def last_words_file(run_id: int, attempt: int, node_rank: int) -> Path:
    """Where an attempt's processes append their failure lines (LAST_WORDS_ENV): in memory (/dev/shm) where there
    is one, else the temp directory; outside the run directory either way, so a full run disk cannot swallow them."""
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / f"ulab-run{run_id}-attempt{attempt}-node{node_rank}-{os.getpid()}.last-words"


def failure_reason(code: int, log_tail: str, cause: str | None = None) -> str:
    """Why the trainer ended with `code` (non-zero), one line first: the known cause found in the attempt's log
    (`exits.known_cause`: no space left on device, out of memory, no tokenizer, a killed torchrun) when there is one,
    with the signal or exit code and the ranks torchrun reports killed by a signal; then the log tail without
    Python warnings (unrelated to the failure, and they crowd it out)."""
    ranks = [f"rank {rank} {describe_exit(int(c))}" for rank, c in _TORCHRUN_FAILURE.findall(log_tail)
             if int(c) < 0]
    head = f"the trainer was {describe_exit(code)}" if code < 0 else f"exit code {code}"
    if ranks:
        head += f" ({'; '.join(dict.fromkeys(ranks))})"
    if cause:
        head = f"{cause} ({head})"
    if code < 0:  # what it printed before it was killed says nothing about why
        return head
    return f"{head}:\n{_WARNING.sub('', log_tail).strip()}"


def attempt_cause(log_path: Path, words: Path) -> str | None:
    """The known cause of the attempt's failure, from its whole section of the log and its last words."""
    return known_cause(attempt_lines(log_path, words))


def supervise(run: Run, settings) -> str:
    """Node 0 (or the only node): owns the run's state, heartbeat and exit."""
    reason = too_big_for_this_worker(run.spec)
    if reason:
        transitions.finish(run.id, run.attempt, RunState.FAILED, reason)
        return RunState.FAILED.value
    endpoint = gang.publish_endpoint(run, run.worker) if gang.num_nodes(run.spec) > 1 else None
    procs, run_dir, log_path = launch(run, settings, 0, endpoint)
    with stopped_on_error(procs, settings):
        transitions.start(run.id, run.attempt, str(run_dir))
        shipper = MetricShipper(run_dir, settings.api_url, run.id, worker_token())
    mirror = trackers.forwarder_for(run.id, run.spec, run_dir, settings)  # run.report_to: its own thread
    if mirror is not None:
        mirror.start()  # goes on after the run until every tracker has everything, the final state included
    code, stopped, shipped, left = watch_and_ship(
        procs, shipper, lambda: transitions.heartbeat(run.id, run.attempt, shipper.last_step), settings,
        stop_wait_s(run.spec, settings))
    rule = read_stopped(run_dir, run.attempt) if code == EXIT_STOPPED else None
    if rule is not None:  # the same alert row the API raises from the shipped metrics, unless it has already
        alerts.trainer_stopped(run.id, run.attempt, rule["kind"], int(rule["step"]), str(rule["message"]))
    log_tail = "\n".join(tail_lines(log_path, LOG_TAIL_LINES))
    words = last_words_file(run.id, run.attempt, 0)
    cause = attempt_cause(log_path, words) if code not in (0, EXIT_STOPPED) and not stopped else None
    words.unlink(missing_ok=True)
    state = exit_state(code, stopped, f"{log_tail}\n{cause or ''}")
    reason = None if state == RunState.SUCCEEDED else (
        "cancelled by request" if state == RunState.CANCELLED else failure_reason(code, log_tail, cause))
    if not shipped:
        reason = (reason or "") + "\nsome metrics could not be shipped to the API; they remain in the run directory"
    if left:
        reason = (reason or "") + f"\nprocesses {', '.join(map(str, left))} of the run survived SIGKILL"
    if run.kind == "probe" and state == RunState.SUCCEEDED:  # stored before the run reads succeeded: the page
        record_probe(run.id)  # that waited for it then finds the result with the plan
    transitions.finish(run.id, run.attempt, state, reason, last_step=shipper.last_step)
    log.info("run %s: %s (exit code %s)", run.id, state.value, code)
    if state in (RunState.SUCCEEDED, RunState.OOM, RunState.FAILED) and shipper.last_step > 0:
        record_calibration(run.id)
    return state.value


def record_calibration(run_id: int) -> None:
    """Store the finished run's prediction next to its measurement (backend/calibration); never fails the run."""
    from backend.calibration.service import record_run

    try:
        with session_scope() as session:
            run = session.get(Run, run_id)
            if run is not None:
                record_run(session, run)
    except Exception:  # noqa: BLE001 - calibration is a by-product of a run, not part of its outcome
        log.exception("run %s: could not record its calibration point", run_id)


def record_probe(run_id: int) -> None:
    """Store a probe's result with its plan and in the calibration store (backend/runs/probe.py)."""
    from backend.runs.probe import record_probe as store

    try:
        with session_scope() as session:
            run = session.get(Run, run_id)
            if run is not None and store(session, run) is None:
                log.warning("probe run %s left no %s in %s", run_id, "probe.json", run.run_dir)
    except Exception:  # noqa: BLE001 - the probe's own log keeps what it measured
        log.exception("probe run %s: could not store its result", run_id)


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
    procs, run_dir, _ = launch(run, settings, node_rank, endpoint)
    # c10d may place global rank 0 (the metrics writer) on any node: every node ships what it finds.
    with stopped_on_error(procs, settings):
        shipper = MetricShipper(run_dir, settings.api_url, run.id, worker_token())
    code, _, _, _ = watch_and_ship(procs, shipper, lambda: gang.node_heartbeat(run.id, run.attempt, node_rank),
                                   settings, stop_wait_s(run.spec, settings))
    last_words_file(run.id, run.attempt, node_rank).unlink(missing_ok=True)  # node 0 reports the run's reason
    gang.record_node_exit(run.id, run.attempt, node_rank, code)
    log.info("run %s node %s: exit code %s", run.id, node_rank, code)
    return f"node exit {code}"
