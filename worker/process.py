"""The processes of one attempt, seen from the worker: `ulab train` started detached from the worker (and tied
to its life), then every process the attempt starts (torchrun and each rank, whatever their process groups)
recorded as it appears and stopped all together. The attempt's tag, lock and signal helpers are in
worker/trainer/attempt.py, which `ulab train` uses the same way."""
from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path

import psutil

from worker.trainer import attempt as attempts

log = logging.getLogger(__name__)


def start_group(cmd: list[str], log_path: Path, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start `cmd` (an argument list; no shell) in a session of its own, output to log_path. It gets SIGTERM
    when the worker dies (even by SIGKILL): `ulab train` then stops its ranks, which save a checkpoint, instead of
    training on as an orphan nobody ships metrics for."""
    out = log_path.open("ab")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env, cwd=cwd, preexec_fn=attempts.die_with_parent)
    finally:
        out.close()  # the child holds its own descriptor


class AttemptProcesses:
    """`ulab train` (`proc`) and everything it starts. `lock` and `attempt` are the tag it was started with
    (attempt.attempt_tag), by which its processes are found even once orphaned; `refresh` also records its
    descendants as they appear, in case one drops the tag."""

    def __init__(self, proc: subprocess.Popen, lock: Path | str | None = None, attempt: int | None = None):
        self.proc, self.lock, self.attempt = proc, lock, attempt
        self.seen: dict[int, psutil.Process] = {}
        try:
            self.launcher: psutil.Process | None = psutil.Process(proc.pid)
        except psutil.NoSuchProcess:
            self.launcher = None

    def refresh(self) -> None:
        """Record the descendants of `ulab train` that have appeared (cheap: run on every tick of the watch)."""
        if self.launcher is None:
            return
        try:
            for p in self.launcher.children(recursive=True):
                self.seen.setdefault(p.pid, p)  # the Process keeps its start time: a reused pid is not ours
        except psutil.Error:
            pass

    def everything(self) -> list[psutil.Process]:
        """What of the attempt still runs: `ulab train`, what it was seen to start, and what carries its tag."""
        self.refresh()
        if self.lock is not None:
            for p in attempts.tagged(self.lock, attempt=self.attempt):
                self.seen.setdefault(p.pid, p)
        procs = ([self.launcher] if self.launcher is not None else []) + list(self.seen.values())
        return [p for p in procs if attempts.running(p)]

    def stop(self, grace_s: float) -> list[int]:
        """SIGTERM `ulab train`, which forwards it once to torchrun, which stops the ranks (they save a checkpoint);
        after `grace_s` SIGKILL everything of the attempt that is left. Answers the pids that survived SIGKILL."""
        self.refresh()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.finish(grace_s)

    def finish(self, grace_s: float) -> list[int]:
        """Wait up to `grace_s` for every process of the attempt to exit (after `ulab train` was killed, torchrun
        is stopping its ranks on its own), SIGKILL the rest, then look again by tag to verify that nothing is
        left. Answers the pids still running (logged)."""
        left = attempts.kill_left(self.everything(), grace_s)
        if self.proc.poll() is None:
            try:
                self.proc.wait(attempts.KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        left += [p for p in self.everything() if p not in left]
        if left:
            log.error("processes %s of %s (attempt %s) survived SIGKILL", attempts.describe(left), self.lock,
                      self.attempt)
        return [p.pid for p in left]
