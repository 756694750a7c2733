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


def test_the_attempt_is_read_from_its_outcome_record_not_its_log(tmp_path, monkeypatch):
    """The worker reads the attempt's record (plan/outcome.py): in the run directory, else beside the last words
    (a full run disk); its message leads the reason; a log that says "out of memory" decides nothing; an attempt
    killed before it wrote a record ends by its exit code alone."""
    from plan.outcome import OUTCOME_FILE, Cause, Outcome, write_outcome
    from worker import supervise
    from worker.supervise import attempt_outcome, exit_state

    monkeypatch.setattr(supervise, "last_words_dir", lambda: tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train.log").write_text("CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert attempt_outcome(run_dir, 1, 7, 1) == Outcome(Cause.ERROR, 1)
    assert exit_state(False, attempt_outcome(run_dir, 1, 7, 1)) == "failed"  # the log's words decide nothing
    assert exit_state(False, attempt_outcome(run_dir, -9, 7, 1)) == "failed"
    assert failure_reason(-9, "", attempt_outcome(run_dir, -9, 7, 1).message or None) == \
        "the trainer was killed by SIGKILL"
    full = Outcome.of(Cause.NO_SPACE, "no space left on device: the disk of the run directory is full")
    write_outcome(run_dir, full, paths=[supervise.outcome_file(7, 1, 0)])  # the run disk could not take it
    found = attempt_outcome(run_dir, 1, 7, 1)
    assert found == full
    assert exit_state(False, found) == "failed"
    assert failure_reason(1, "step 100", found.message).splitlines()[0] == \
        "no space left on device: the disk of the run directory is full (exit code 1):"
    write_outcome(run_dir, Outcome.of(Cause.OOM, "out of memory on rank 1"), paths=[run_dir / OUTCOME_FILE])
    assert exit_state(False, attempt_outcome(run_dir, 3, 7, 1)) == "oom"
    assert exit_state(True, attempt_outcome(run_dir, 3, 7, 1)) == "cancelled"
    write_outcome(run_dir, Outcome.of(Cause.DIVERGED, "stopped: loss diverged"), paths=[run_dir / OUTCOME_FILE])
    assert exit_state(False, attempt_outcome(run_dir, 76, 7, 1)) == "stopped"
    write_outcome(run_dir, Outcome.of(Cause.COMPLETED), paths=[run_dir / OUTCOME_FILE])
    assert exit_state(False, attempt_outcome(run_dir, 0, 7, 1)) == "succeeded"
    # a record of "completed" beside a failed exit (a stale one) is not taken
    assert attempt_outcome(run_dir, 1, 7, 1) == Outcome(Cause.ERROR, 1)
    # `ulab train` SIGKILLed: its ranks' SIGTERM record (checkpoint saved) is not the attempt's word
    write_outcome(run_dir, Outcome.of(Cause.SIGNAL, "preempted: signal 15 on rank 1"), paths=[run_dir / OUTCOME_FILE])
    assert attempt_outcome(run_dir, -9, 7, 1) == Outcome(Cause.SIGNAL, -9)
    assert failure_reason(-9, "", attempt_outcome(run_dir, -9, 7, 1).message or None) == \
        "the trainer was killed by SIGKILL"
    assert supervise.remove_stale_last_words(tmp_path / "shm") == []  # this process's pid: not stale


