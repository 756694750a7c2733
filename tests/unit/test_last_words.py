"""A worker killed outright (SIGKILL) never removes its trainer's last-words file (worker/supervise.py
`last_words_file`, named with the worker's pid); the next worker to start removes those whose pid no longer runs,
and nothing else."""
from __future__ import annotations

import os
import subprocess
import sys

from worker import supervise
from worker.supervise import pid_alive, remove_stale_last_words


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not pid_alive(proc.pid)  # pid reuse within these few lines would make the test meaningless
    return proc.pid


def test_start_up_cleanup_removes_only_the_files_of_workers_that_no_longer_run(tmp_path):
    dead, live = dead_pid(), os.getpid()
    stale = tmp_path / f"ulab-run7-attempt2-node0-{dead}.last-words"
    kept = tmp_path / f"ulab-run8-attempt1-node1-{live}.last-words"
    other_name = tmp_path / f"ulab-run9-{dead}.last-words"  # not a name last_words_file gives: left alone
    unrelated = tmp_path / f"notes-{dead}.txt"
    for path in (stale, kept, other_name, unrelated):
        path.write_text("[rank0]: out of memory\n")

    assert remove_stale_last_words(tmp_path) == [stale]
    assert not stale.exists()
    assert kept.exists()
    assert other_name.exists()
    assert unrelated.exists()
    assert remove_stale_last_words(tmp_path) == []  # a second start finds nothing more to remove


def test_the_cleanup_matches_the_names_last_words_file_gives(tmp_path, monkeypatch):
    monkeypatch.setattr(supervise, "last_words_dir", lambda: tmp_path)  # not the shared /dev/shm
    mine = supervise.last_words_file(12, 3, 1)
    assert mine.parent == tmp_path
    mine.write_text("x\n")
    theirs = mine.with_name(mine.name.replace(f"-{os.getpid()}.", f"-{dead_pid()}."))
    theirs.write_text("x\n")

    assert remove_stale_last_words() == [theirs]  # in last_words_dir() by default
    assert mine.exists()
