"""One attempt of a run in its run directory: how every process of it is found, the lock that keeps two attempts
from sharing the directory, and the metrics file each attempt writes.

Found by a tag, not by parentage: torchrun starts each rank in a session of its own, so a process-group signal
misses them, and an orphaned rank has init for a parent. `ulab train` carries ULAB_RUN_LOCK (the path of the
run's lock file) and ULAB_ATTEMPT in its environment; torchrun and the ranks inherit both, and
/proc/PID/environ shows them for as long as the process lives, whoever its parent is now.

The lock: RUN_DIR/run.lock (run-node{k}.lock for node k of a multi-node run). Every process of an attempt holds a
shared flock on it for its whole life: `ulab train` (which takes it exclusive first, to prove that no process
of another attempt is left, then shares it), torchrun (it inherits the launcher's descriptor) and each rank (a
shared lock of its own). The file names the attempt that owns it: a rank whose attempt is not the owner refuses
to train (a fencing token), so a late-starting rank of a dead attempt never writes beside the live one.

The metrics: attempt 1 writes RUN_DIR/metrics.jsonl; attempt N >= 2 writes metrics.attempt-N.jsonl, from the step
after the checkpoint it resumed, or from step 1 when it found none. No attempt rewrites, truncates or deletes
another's file, so a shipper never finds a file it has an offset in replaced under it. Read together
(`read_metrics`, and the worker's shipper through the API's upsert), a later attempt's line for a step replaces an
earlier one's, and the files before the newest one that starts at step 1 are superseded (`current_files`).
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import signal
import time
from pathlib import Path

import psutil

RUN_LOCK_ENV = "ULAB_RUN_LOCK"
ATTEMPT_ENV = "ULAB_ATTEMPT"
PR_SET_PDEATHSIG = 1
# After SIGKILL a process is gone within milliseconds unless it sits in uninterruptible sleep (a wedged GPU or
# NIC); this long is waited before such a process is reported as left over.
KILL_WAIT_S = 5.0
POLL_S = 0.1
_METRICS = re.compile(r"^metrics(?:\.attempt-(\d+))?\.jsonl$")


class LockBusy(RuntimeError):
    """Another attempt holds the run directory and could not be stopped."""


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """In a child (before exec, or first thing in it): have the kernel send `sig` when its parent dies, even by
    SIGKILL, so nothing of a run outlives the process that supervises it. A no-op off Linux."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    except OSError:
        pass


def lock_file(run_dir: Path | str, node_rank: int = 0) -> Path:
    return Path(run_dir).resolve() / (f"run-node{node_rank}.lock" if node_rank else "run.lock")


def attempt_tag(lock: Path | str, attempt: int) -> dict[str, str]:
    """The environment that marks a process (and all it starts) as part of `attempt` on `lock`'s run directory."""
    return {RUN_LOCK_ENV: str(lock), ATTEMPT_ENV: str(attempt)}


def tagged(lock: Path | str, attempt: int | None = None, other_than: int | None = None) -> list[psutil.Process]:
    """Live processes (this one excepted) tagged with `lock`: of `attempt` only, or of any attempt but
    `other_than`, or all."""
    found, me = [], os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            env = p.environ()
        except (psutil.Error, OSError):  # gone, a zombie, or another user's
            continue
        if env.get(RUN_LOCK_ENV) != str(lock):
            continue
        theirs = env.get(ATTEMPT_ENV)
        if attempt is not None and theirs != str(attempt):
            continue
        if other_than is not None and theirs == str(other_than):
            continue
        found.append(p)
    return found


def running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie holds nothing; its parent, maybe init, reaps it when it will)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until none of `procs` runs or the timeout passes; answers those still running."""
    end = time.monotonic() + timeout_s
    alive = [p for p in procs if running(p)]
    while alive and time.monotonic() < end:
        time.sleep(POLL_S)
        alive = [p for p in alive if running(p)]
    return alive


def send(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)  # psutil refuses a pid that was reused by another process
        except psutil.Error:
            pass


def kill_left(procs: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """Wait up to `grace_s` for `procs` to exit, SIGKILL the rest and wait for them; answers any still running."""
    alive = wait_gone(procs, grace_s)
    send(alive, signal.SIGKILL)
    return wait_gone(alive, KILL_WAIT_S)


def supervised_roots(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The tops of an attempt's process tree that still have a parent outside it: `ulab train` under its worker
    or shell (or torchrun, when `ulab train` was started by hand and so carries no tag in /proc). The others
    hear of a stop without us: a rank from torchrun, torchrun from `ulab train`, and an orphan got its death
    signal (PR_SET_PDEATHSIG) from the kernel when its parent died. Signalling those again would hurt: a second
    SIGTERM makes torchrun quit before its ranks have saved. (Under a subreaper other than init an orphan looks
    supervised and gets that second signal; its ranks then die without saving, which is safe, only wasteful.)"""
    pids = {p.pid for p in procs}
    roots = []
    for p in procs:
        try:
            parent = p.ppid()
        except psutil.Error:
            continue
        if parent > 1 and parent not in pids:
            roots.append(p)
    return roots


def stop_processes(procs: list[psutil.Process], grace_s: float) -> list[psutil.Process]:
    """Stop an attempt's processes: SIGTERM its supervised roots (the ranks save a checkpoint and exit), SIGKILL
    whatever is left after `grace_s`; answers any that survived SIGKILL."""
    send(supervised_roots(procs), signal.SIGTERM)
    return kill_left(procs, grace_s)


def describe(procs: list[psutil.Process]) -> str:
    return ", ".join(str(p.pid) for p in procs)


class RunLock:
    """The run directory's lock, held (shared) by every process of one attempt; see the module's docstring."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        self.fd: int | None = None
        self.attempt: int | None = None  # the attempt this process holds it for

    def _open(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self.fd

    def owner(self) -> int | None:
        """The attempt the lock file names (the last one to take it), or None."""
        try:
            return int(json.loads(self.path.read_text())["attempt"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def take(self, attempt: int, stop_grace_s: float, say=print) -> None:
        """For `ulab train`: stop every process of another attempt still in this run directory (SIGTERM, then
        SIGKILL after `stop_grace_s`), take the lock exclusively (waiting as long again for holders this host
        cannot see, on a shared file system), record `attempt` as the owner, then share the lock so that this
        attempt's torchrun and ranks can hold it too. Raises LockBusy when it stays held."""
        others = tagged(self.path, other_than=attempt)
        if others:
            say(f"attempt {attempt}: processes of an earlier attempt still run in {self.path.parent} "
                f"(pids {describe(others)}); stopping them first")
            left = stop_processes(others, stop_grace_s)
            if left:
                raise LockBusy(f"{self.path}: processes {describe(left)} of an earlier attempt survived SIGKILL")
        fd = self._open()
        end = time.monotonic() + stop_grace_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > end:
                    self.release()
                    raise LockBusy(f"{self.path} is still held by attempt {self.owner()} after {stop_grace_s:.0f} s; "
                                   "another host may be running it") from None
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"attempt": attempt, "pid": os.getpid()}).encode(), 0)
        fcntl.flock(fd, fcntl.LOCK_SH)  # converted in place: the ranks (shared) may join from here
        self.attempt = attempt

    def join(self, attempt: int) -> None:
        """For a rank: share the lock of its attempt; LockBusy if another attempt owns the directory now."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            raise LockBusy(f"{self.path} is being taken by another attempt; attempt {attempt} stops") from None
        owner = self.owner()
        if owner != attempt:
            self.release()
            raise LockBusy(f"{self.path} belongs to attempt {owner}; this rank of attempt {attempt} stops")
        self.attempt = attempt

    def release(self) -> None:
        """Let go of it (a process's exit does the same)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def inheritable_fd(self) -> int:
        """The descriptor for `pass_fds`: a child sharing it holds the same lock until it exits."""
        assert self.fd is not None, "take the lock first"
        os.set_inheritable(self.fd, True)
        return self.fd


def previous_attempt(run_dir: Path | str, node_rank: int = 0) -> int:
    return RunLock(lock_file(run_dir, node_rank)).owner() or 0


# --- metrics files ----------------------------------------------------------------------------------------------

def metrics_file(run_dir: Path | str, attempt: int) -> Path:
    return Path(run_dir) / ("metrics.jsonl" if attempt <= 1 else f"metrics.attempt-{attempt}.jsonl")


def metrics_files(run_dir: Path | str) -> list[Path]:
    """Every attempt's metrics file in the run directory, oldest attempt first."""
    found = []
    for p in Path(run_dir).glob("metrics*.jsonl"):
        m = _METRICS.match(p.name)
        if m:
            found.append((int(m.group(1) or 1), p))
    return [p for _, p in sorted(found)]


def first_record(path: Path) -> dict | None:
    """The file's first step record (evaluation records aside), or None while it has none."""
    try:
        with path.open("rb") as f:
            for raw in f:
                if not raw.endswith(b"\n"):
                    return None  # a torn line: not known yet
                try:
                    record = json.loads(raw)
                    if isinstance(record, dict) and "eval" not in record:
                        int(record["step"])
                        return record
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        return None
    return None


def first_step(path: Path) -> int | None:
    """The step of the file's first step record, or None while it has none."""
    record = first_record(path)
    return None if record is None else int(record["step"])


def current_files(run_dir: Path | str) -> list[Path]:
    """The attempts' metrics files that still count, oldest first: from the newest one that starts at step 1 (a
    start from scratch supersedes every file before it) on."""
    files = metrics_files(run_dir)
    scratch = [i for i, p in enumerate(files) if first_step(p) == 1]
    return files[scratch[-1]:] if scratch else files


def read_metrics(run_dir: Path | str) -> list[dict]:
    """The run's step records, one per step in step order: a later attempt's line replaces an earlier one's (as
    the API's upsert does with what the shipper sends)."""
    by_step: dict[int, dict] = {}
    for path in current_files(run_dir):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                if "eval" not in record:  # evaluation records (evaluate.py) share the file: read_evals
                    by_step[int(record["step"])] = record
            except (ValueError, KeyError, TypeError):
                continue
    return [by_step[s] for s in sorted(by_step)]


def read_evals(run_dir: Path | str) -> list[dict]:
    """The run's evaluation records (worker/trainer/evaluate.py) in the order they were written, all attempts."""
    out = []
    for path in metrics_files(run_dir):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and "eval" in record:
                out.append(record)
    return out
