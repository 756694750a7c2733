"""The run directory's lock (worker/trainer/attempt.py): shared by the processes of one attempt, exclusive against
any other attempt, and naming its owner so that a late rank of an old attempt refuses to start. flock locks of
separate opens conflict within one process too, so each RunLock here stands for a process."""
import pytest

from worker.trainer.attempt import LockBusy, RunLock, lock_file, metrics_file, metrics_files, read_metrics


def test_one_attempt_shares_it_and_another_can_neither_join_nor_take_it(tmp_path):
    path = lock_file(tmp_path)
    launcher = RunLock(path)
    launcher.take(1, stop_grace_s=0.5)
    rank = RunLock(path)
    rank.join(1)  # the ranks of attempt 1 share it with their launcher
    with pytest.raises(LockBusy, match="belongs to attempt 1"):
        RunLock(path).join(2)
    with pytest.raises(LockBusy, match="still held by attempt 1"):
        RunLock(path).take(2, stop_grace_s=0.5)
    launcher.release()  # what its exit does
    with pytest.raises(LockBusy):  # a rank of attempt 1 still holds it
        RunLock(path).take(2, stop_grace_s=0.3)
    rank.release()
    RunLock(path).take(2, stop_grace_s=0.5)
    assert RunLock(path).owner() == 2
    with pytest.raises(LockBusy, match="belongs to attempt 2"):  # a late rank of attempt 1 is fenced off
        RunLock(path).join(1)


def test_metrics_files_of_attempts_read_as_one_series(tmp_path):
    metrics_file(tmp_path, 1).write_text("".join(f'{{"step": {s}, "loss": 1}}\n' for s in range(1, 6)))
    metrics_file(tmp_path, 3).write_text('{"step": 4, "loss": 3}\n{"step": 5, "loss": 3}\n{"step": 6, "loss": 3}\n')
    metrics_file(tmp_path, 2).write_text('{"step": 4, "loss": 2}\n')
    (tmp_path / "metrics.jsonl.tmp").write_text("not one of them\n")
    assert [p.name for p in metrics_files(tmp_path)] == ["metrics.jsonl", "metrics.attempt-2.jsonl",
                                                         "metrics.attempt-3.jsonl"]
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 1), (3, 1), (4, 3), (5, 3), (6, 3)]
