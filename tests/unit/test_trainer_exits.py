"""The trainer decides its failure's cause once, where it happens, and records it (plan/outcome.py); the exit codes
are declared once."""
import re
from pathlib import Path

import pytest

from plan.outcome import EXIT_CODE, OUTCOME_FILE, Cause, Outcome, read_outcome
from worker.trainer.exits import EXIT_FAILED, EXIT_OOM, says_out_of_memory

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text", [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "549755813888 bytes. Error code 12 (Cannot allocate memory)",
    "out of memory on rank 1: tried to allocate 512.00 GiB (RuntimeError)",
    "torch.OutOfMemoryError: HIP Out Of Memory",
])
def test_out_of_memory_is_recognised_however_it_is_worded(text):
    assert says_out_of_memory(text)


def test_other_failures_are_not_out_of_memory():
    assert not says_out_of_memory("rank 0: ValueError: memory_efficient_attention needs a mask")


def test_a_rank_failure_is_one_line_its_exit_code_and_the_first_record(tmp_path, monkeypatch):
    """train.failed, the one ladder of the trainer's and the probe's ranks: out of memory however torch raises it,
    no space left on device from the errno, anything else as `rank R: Type: first line`; the first failing rank's
    record stands."""
    import errno

    import torch

    from worker.trainer.train import failed

    monkeypatch.delenv("ULAB_OUTCOME", raising=False)
    assert failed(tmp_path, 0, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == EXIT_OOM
    assert failed(tmp_path, 1, RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                            "549755813888 bytes")) == EXIT_OOM
    assert failed(tmp_path, 1, ValueError("bad plan\nsecond line")) == EXIT_FAILED
    assert read_outcome(tmp_path) == Outcome(Cause.OOM, EXIT_OOM, "out of memory on rank 0: tried to allocate "
                                             "2.00 GiB (OutOfMemoryError)", rank=0)
    (tmp_path / OUTCOME_FILE).unlink()
    try:
        raise RuntimeError("checkpoint save failed") from OSError(errno.ENOSPC, "No space left on device")
    except RuntimeError as e:
        assert failed(tmp_path, 0, e) == EXIT_FAILED
    got = read_outcome(tmp_path)
    assert got is not None
    assert (got.cause, got.message) == (Cause.NO_SPACE, "no space left on device: the disk of the run directory is "
                                                        "full")
    (tmp_path / OUTCOME_FILE).unlink()
    assert failed(tmp_path, 1, ValueError("bad plan\nsecond line")) == EXIT_FAILED
    assert read_outcome(tmp_path) == Outcome(Cause.ERROR, EXIT_FAILED, "rank 1: ValueError: bad plan", rank=1)


def test_each_exit_code_is_declared_once():
    """Only plan/outcome.py assigns the trainer's exit codes (EXIT_* = <number>); everyone else imports them."""
    declared = []
    for path in [*REPO.glob("plan/**/*.py"), *REPO.glob("backend/**/*.py"), *REPO.glob("worker/**/*.py"),
                 *REPO.glob("bench/**/*.py")]:
        for line in path.read_text().splitlines():
            if re.match(r"^\s*(EXIT_[A-Z_]+\s*(,\s*EXIT_[A-Z_]+\s*)*)=\s*\d", line):
                declared.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert [d.split(":")[0] for d in declared] == ["plan/outcome.py"], declared
    assert set(EXIT_CODE) == set(Cause)
