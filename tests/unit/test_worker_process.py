"""A trainer started by the worker never outlives a failure of the worker code between launch and the watch loop,
and a stop reaches every process of the attempt, whatever its process group or parent."""
import os
import signal
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from worker.process import AttemptProcesses, start_group
from worker.supervise import failure_reason, stopped_on_error
from worker.trainer.attempt import attempt_tag, lock_file, running

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# a parent that starts a child in a session of its own (as torchrun starts each rank) and ignores SIGTERM
SPAWNER = [sys.executable, "-c", "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
           "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
           "time.sleep(60)"]


def test_a_failure_after_launch_stops_the_trainer(tmp_path):
    procs = AttemptProcesses(start_group(SLEEP, tmp_path / "train.log"))
    with pytest.raises(ConnectionError), stopped_on_error(procs, SimpleNamespace(cancel_grace_s=5.0)):
        raise ConnectionError("database away")
    assert procs.proc.poll() is not None


def test_no_failure_leaves_it_running(tmp_path):
    procs = AttemptProcesses(start_group(SLEEP, tmp_path / "train.log"))
    try:
        with stopped_on_error(procs, SimpleNamespace(cancel_grace_s=5.0)):
            pass
        assert procs.proc.poll() is None
    finally:
        procs.proc.kill()
        procs.proc.wait()


def _child_of(pid: int, timeout_s: float = 10) -> psutil.Process:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        kids = psutil.Process(pid).children()
        if kids:
            return kids[0]
        time.sleep(0.05)
    raise AssertionError("the child did not start")


def test_stop_kills_a_child_in_another_session_found_by_its_tag(tmp_path):
    lock = lock_file(tmp_path)
    proc = start_group(SPAWNER, tmp_path / "train.log", env={**os.environ, **attempt_tag(lock, 3)})
    child = _child_of(proc.pid)
    assert os.getsid(child.pid) != os.getsid(proc.pid)  # a group or session signal would miss it
    procs = AttemptProcesses(proc, lock, 3)  # nothing refreshed: only the tag can find the child
    assert procs.stop(grace_s=0.5) == []
    assert proc.returncode == -signal.SIGKILL
    assert not running(child)  # a zombie until init reaps it


def test_finish_kills_what_the_dead_trainer_left_behind(tmp_path):
    """`ulab train` SIGKILLed: its child (a rank, say) lives on as an orphan; the worker's finish ends it."""
    proc = start_group(SPAWNER, tmp_path / "train.log")
    procs = AttemptProcesses(proc)
    child = _child_of(proc.pid)
    procs.refresh()  # seen once, while its parent lived
    proc.kill()
    proc.wait()
    assert child.is_running()
    assert procs.finish(grace_s=0.2) == []
    assert not running(child)


def test_the_reason_names_the_signal_and_leaves_out_warnings():
    tail = ("/x/y.py:12: FutureWarning: `foo` is deprecated\n  warnings.warn(\nstep 100\n"
            "error: rank 1: RuntimeError: boom")
    assert failure_reason(-9, tail) == "the trainer was killed by SIGKILL"
    assert failure_reason(1, tail) == "exit code 1:\nstep 100\nerror: rank 1: RuntimeError: boom"
    # a rank's warning, tagged by torchrun with the rank (plan.launch.RANK_PREFIX), goes with its source line
    tagged = ("[rank1]: /x/y.py:12: FutureWarning: `foo` is deprecated\n[rank1]:   return func(*args)\n"
              "[rank0]: step 100\nerror: rank 1: RuntimeError: boom")
    assert failure_reason(1, tagged) == "exit code 1:\n[rank0]: step 100\nerror: rank 1: RuntimeError: boom"
    summary = ("[1]:\n  time      : 2026-11-24_12:00:00\n  host      : h\n  rank      : 1 (local_rank: 1)\n"
               "  exitcode  : -9 (pid: 4242)\n  error_file: <N/A>\n")
    assert failure_reason(1, summary).startswith("exit code 1 (rank 1 killed by SIGKILL):")


def test_the_reason_names_a_known_cause_found_anywhere_in_the_attempt(tmp_path):
    """Issue 25: the cause is searched in the whole attempt's part of the log (not in its last lines) and in the
    last words kept outside the run directory; its words come first, on one line."""
    from worker.supervise import attempt_cause

    log = tmp_path / "train.log"
    banner = "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"
    noise = "".join(f"[rank1]: step {i}\n" for i in range(200))
    log.write_text(f"--- attempt 1 on w ---\nOSError: [Errno 28] No space left on device\n"
                   f"--- attempt 2 on w ---\n{banner}\n[rank0]: OSError: [Errno 28] No space left on device: "
                   f"'/runs/run-1/metrics.attempt-2.jsonl'\n{noise}error: torchrun killed by SIGKILL\n")
    cause = attempt_cause(log, tmp_path / "none")
    assert cause == "no space left on device: the disk of the run directory is full"
    reason = failure_reason(1, banner + "\n" + noise, cause)
    assert reason.splitlines()[0] == f"{cause} (exit code 1):"
    log.write_text(f"--- attempt 1 on w ---\n{banner}\n{noise}error: torchrun killed by SIGKILL\n")
    assert failure_reason(1, banner, attempt_cause(log, tmp_path / "none")).splitlines()[0] == \
        "torchrun was killed by SIGKILL (exit code 1):"
    log.write_text("--- attempt 1 on w ---\nerror: run.model_path: /m has no tokenizer that loads (x)\n")
    assert "no tokenizer" in attempt_cause(log, tmp_path / "none")
    words = tmp_path / "words"  # the log could not be written: the last words say it
    log.write_text("--- attempt 1 on w ---\n")
    words.write_text("out of memory on rank 1: tried to allocate 2.00 GiB (OutOfMemoryError)\n")
    assert attempt_cause(log, words) == "out of memory on rank 1: tried to allocate 2.00 GiB (OutOfMemoryError)"
