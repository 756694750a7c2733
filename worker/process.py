"""The trainer's process group: start it detached from the worker, stop all of it."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from pathlib import Path


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when the worker dies (even by SIGKILL), so torchrun stops its ranks
    instead of training on as an orphan nobody ships metrics for."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the reaper still marks the run lost
        pass


def start_group(cmd: list[str], log_path: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start `cmd` (an argument list; no shell) as the leader of a new process group, output to log_path."""
    log = log_path.open("ab")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=cwd, preexec_fn=_die_with_parent)
    finally:
        log.close()  # the child holds its own descriptor


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def stop_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM the whole group (the trainer checkpoints and exits), then SIGKILL after the grace period."""
    signal_group(proc, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while proc.poll() is None and time.monotonic() < end:
        time.sleep(0.2)
    signal_group(proc, signal.SIGKILL)  # also reaps ranks that outlived torchrun
    return proc.wait()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
