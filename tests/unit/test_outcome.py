"""The attempt's outcome record (plan/outcome.py): one schema, written first-wins by the ranks and last by the
launcher, read from the run directory or the second place a full disk cannot swallow; the GPU check's rows read it."""
from __future__ import annotations

import pytest

from bench.gpu_check_run import row_status
from plan.outcome import (
    EXIT_FAILED,
    EXIT_OOM,
    EXIT_STOPPED,
    OUTCOME_ENV,
    OUTCOME_FILE,
    Cause,
    Outcome,
    clear_outcome,
    read_outcome,
    without_record,
    write_outcome,
)


@pytest.fixture
def second(tmp_path, monkeypatch):
    place = tmp_path / "shm" / "attempt.outcome"
    place.parent.mkdir()
    monkeypatch.setenv(OUTCOME_ENV, str(place))
    return place


def test_the_first_rank_writes_the_record_and_the_launcher_has_the_last_word(tmp_path, second):
    run = tmp_path / "run"
    run.mkdir()
    assert read_outcome(run) is None
    oom = Outcome.of(Cause.OOM, "out of memory on rank 1", rank=1, step=7)
    assert write_outcome(run, oom, first=True)
    assert write_outcome(run, Outcome.of(Cause.ERROR, "rank 0: a peer went away", rank=0), first=True)
    assert read_outcome(run) == oom == Outcome.from_json(second.read_text())  # both places, the first rank's
    assert (oom.exit_code, Outcome.of(Cause.DIVERGED).exit_code) == (EXIT_OOM, EXIT_STOPPED)
    final = Outcome(Cause.OOM, EXIT_OOM, oom.message, 7, 1, attempt=2)
    assert write_outcome(run, final)
    assert read_outcome(run) == final
    clear_outcome(run)
    assert not (run / OUTCOME_FILE).exists()
    assert not second.exists()


def test_a_full_run_disk_leaves_the_record_in_its_second_place(tmp_path, second):
    gone = tmp_path / "no-such-dir"  # the run directory cannot be written
    record = Outcome.of(Cause.NO_SPACE, "no space left on device: the disk of the run directory is full")
    assert write_outcome(gone, record, first=True)
    assert read_outcome(gone) == record
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / OUTCOME_FILE).write_text("")  # created, then the disk was full: unreadable, skipped
    assert read_outcome(tmp_path / "half") == record


def test_an_attempt_without_a_record_ends_by_its_exit_code(tmp_path):
    assert without_record(0) == Outcome.of(Cause.COMPLETED)
    assert without_record(-9) == Outcome(Cause.SIGNAL, -9)
    assert without_record(1) == Outcome(Cause.ERROR, EXIT_FAILED)
    with pytest.raises(ValueError):
        Outcome.from_json('{"cause": "melted", "exit_code": 1}')


def test_a_gpu_check_row_reads_oom_from_the_record_not_the_exit_code():
    assert row_status(124, None) == "timeout"
    assert row_status(0, None) == "ok"
    assert row_status(EXIT_OOM, None) == f"exit {EXIT_OOM}"  # no record: the code alone says nothing of the cause
    assert row_status(EXIT_OOM, Outcome.of(Cause.OOM, "out of memory on rank 0")) == "oom"
    assert row_status(1, Outcome.of(Cause.ERROR, "rank 0: boom")) == "exit 1"
