"""What the Celery worker (worker/tasks.py) and a Slurm job's node (worker/slurm_job.py) share while an attempt
runs: the trainer's command, the heartbeat thread, the watch-and-ship loop, the wait between SIGTERM and SIGKILL,
and the reason a failed attempt gives. It reaches the service only through the seam (backend/execution/agent.py)."""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

from backend.core.settings import Settings
from backend.execution.agent import RunState, unreachable
from plan.launch import stop_grace_s
from plan.outcome import OUTCOME_FILE, STOP_RULES, Cause, Outcome, describe_exit, read_outcome, without_record
from worker.process import AttemptProcesses
from worker.shipper import MetricShipper

log = logging.getLogger(__name__)
TICK_S = 0.5
LOG_TAIL_LINES = 30
# Seconds between two tries of a report the API could not take (deliver)
REPORT_RETRY_EVERY_S = 1.0
T = TypeVar("T")


def trainer_command(plan_path: Path, run_dir: Path, attempt: int, resume_from: str | None = None,
                    resume: bool | None = None) -> list[str]:
    """`ulab train` as an argument list (no shell): it takes the run directory's lock for this attempt, checks
    the plan and data, then starts torchrun with one process per rank. A resumed start (by default: a later
    attempt) goes on from the last checkpoint, or from `resume_from` (the run's "resume from here": the newer
    checkpoints are moved aside)."""
    cmd = [sys.executable, "-m", "worker.trainer", "--plan", str(plan_path), "--run-dir", str(run_dir),
           "--attempt", str(attempt)]
    if attempt > 1 if resume is None else resume:  # from the newest checkpoint, or step 1 if it has none
        cmd.append("--resume")
        if resume_from:
            cmd += ["--resume-from", resume_from]
    return cmd


# What the worker holds and its trainer must not: the trainer reaches no service (the worker ships its metrics).
WORKER_SECRETS = ("ULAB_DATABASE_URL", "ULAB_BROKER_URL", "ULAB_REDIS_PASSWORD", "ULAB_WORKER_TOKEN",
                  "ULAB_ATTEMPT_TOKEN")


def trainer_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the trainer's processes start with: the worker's, without its credentials."""
    return {k: v for k, v in env.items() if k not in WORKER_SECRETS}


def exit_state(cancelled: bool, outcome: Outcome) -> RunState:
    """The run's state from the attempt's outcome record (plan/outcome.py)."""
    if cancelled:
        return RunState.CANCELLED
    if outcome.cause == Cause.COMPLETED and outcome.exit_code == 0:
        return RunState.SUCCEEDED
    if outcome.cause in STOP_RULES:  # the trainer stopped itself on a stop rule (worker/trainer/stop_rules.py)
        return RunState.STOPPED
    return RunState.OOM if outcome.cause == Cause.OOM else RunState.FAILED


def attempt_outcome(run_dir: Path, code: int, run_id: int, attempt: int, node_rank: int = 0) -> Outcome:
    """The attempt's record: the trainer's (in the run directory, or where the worker told it to keep one, which a
    full disk does not swallow), when `ulab train`'s exit code is the record's. Otherwise the exit code alone: the
    trainer left no record, or the launcher was killed before its final one and a rank's (say, the checkpoint its
    SIGTERM saved) is not the attempt's word, or the record is an earlier attempt's."""
    found = read_outcome(run_dir, [run_dir / OUTCOME_FILE, outcome_file(run_id, attempt, node_rank)])
    return found if found is not None and found.exit_code == code else without_record(code)


class Heartbeat:
    """Calls `beat()` every `every_s` seconds in its own thread, so nothing on the watch loop (a slow or absent
    API while shipping metrics, the grace period of a stop) can delay it past the reaper's limit.
    `beat()` answers whether the run must stop; `stop_requested` is set the first time it says so."""

    def __init__(self, beat: Callable[[], bool], every_s: float):
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

    def __exit__(self, *exc: object) -> None:
        """Stop the thread, then beat once more: the block (watch, then the drain) may ship its last steps after
        the thread's last round, and the step a beat reports is the one the run's row shows (the Slurm path has no
        other: its poller ends the run without a step)."""
        self._done.set()
        self._thread.join(timeout=30)
        try:
            if self.beat():
                self.stop_requested.set()
        except Exception:
            log.exception("final heartbeat failed")


def deliver(call: Callable[[], T], settings: Settings, beat: Callable[[], bool] | None = None,
            what: str = "report") -> T:
    """`call()`, a report of the attempt to the API (its start, its outcome, a stop rule's alert, a node's exit), tried
    again every REPORT_RETRY_EVERY_S while the API cannot be reached (restarting, say: `unreachable`), for up to
    `settings.report_retry_s`; meanwhile `beat` (the attempt's heartbeat) goes on in its own thread, so the reaper
    does not mark a run lost while its outcome waits to be delivered. A refusal is raised at once, and the last
    failure once the time is up."""
    try:
        return call()
    except Exception as exc:
        if not unreachable(exc):
            raise
        log.warning("%s: the API cannot be reached (%s); trying again for up to %.0f s", what, exc,
                    settings.report_retry_s)
    end = time.monotonic() + settings.report_retry_s
    with Heartbeat(beat, settings.heartbeat_s) if beat is not None else nullcontext():
        while True:
            time.sleep(REPORT_RETRY_EVERY_S)
            try:
                got = call()
            except Exception as exc:
                if not unreachable(exc) or time.monotonic() >= end:
                    raise
                continue
            log.info("%s: delivered once the API answered again", what)
            return got


def stop_wait_s(spec: dict[str, Any], settings: Settings) -> float:
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


def watch_and_ship(procs: AttemptProcesses, shipper: MetricShipper, beat_fn: Callable[[], bool],
                   settings: Settings, grace_s: float) -> tuple[int, bool, bool, list[int]]:
    """Beat (in its own thread) from launch until the last metrics are shipped: watch the trainer, then drain
    what it wrote, since the API may still be away when it exits. Answers (exit code, whether it was stopped,
    whether everything was shipped, pids that survived SIGKILL)."""
    with Heartbeat(beat_fn, settings.heartbeat_s) as beat:
        try:
            code, stopped, left = watch(procs, shipper, beat, grace_s)
        finally:
            shipped = shipper.drain(deadline_s=settings.report_retry_s)  # as long as the outcome waits
            shipper.close()
    return code, stopped, shipped, left


@contextmanager
def stopped_on_error(procs: AttemptProcesses, settings: Settings) -> Iterator[None]:
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


# ulab-run<id>-attempt<n>-node<k>-<pid of the worker>.last-words (and .outcome)
_LAST_WORDS = re.compile(r"^ulab-run\d+-attempt\d+-node\d+-(\d+)\.(?:last-words|outcome)$")


def last_words_dir() -> Path:
    """In memory (/dev/shm) where there is one, else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def last_words_file(run_id: int, attempt: int, node_rank: int) -> Path:
    """Where an attempt's processes append their failure lines (LAST_WORDS_ENV): under `last_words_dir()`, outside
    the run directory, so a full run disk cannot swallow them. Named with the worker's pid: the worker removes it
    when the attempt ends, and a worker that was killed outright leaves it to `remove_stale_last_words`."""
    return last_words_dir() / f"ulab-run{run_id}-attempt{attempt}-node{node_rank}-{os.getpid()}.last-words"


def outcome_file(run_id: int, attempt: int, node_rank: int) -> Path:
    """Where the attempt's processes also keep its outcome record (OUTCOME_ENV): beside its last words, outside the
    run directory."""
    return last_words_file(run_id, attempt, node_rank).with_suffix(".outcome")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_stale_last_words(directory: Path | None = None) -> list[Path]:
    """At a worker's start: remove the last-words files (only files of `last_words_file`'s name) whose worker's pid
    no longer runs, left by a worker killed outright (SIGKILL: it never removed its trainer's). Answers them."""
    removed = []
    for path in sorted((directory or last_words_dir()).glob("ulab-run*-node*-*.*")):
        match = _LAST_WORDS.match(path.name)
        if match is None or pid_alive(int(match.group(1))):
            continue
        try:
            path.unlink()
        except FileNotFoundError:
            continue  # another worker starting beside this one removed it first
        except OSError as e:
            log.warning("could not remove the stale last-words file %s: %s", path, e)
            continue
        removed.append(path)
    return removed


def failure_reason(code: int, log_tail: str, cause: str | None = None) -> str:
    """Why the trainer ended with `code` (non-zero), one line first: the message of the attempt's outcome record
    (no space left on device, out of memory, no tokenizer, a killed torchrun, a rank's error) when it has one, with
    the signal or exit code and the ranks torchrun reports killed by a signal; then the log tail without Python
    warnings (unrelated to the failure, and they crowd it out)."""
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
