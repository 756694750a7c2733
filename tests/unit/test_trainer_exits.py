"""One reading of "out of memory" for the trainer (its exception), `ulab train` (a rank's last line) and the
worker (the log tail), and one set of exit codes."""
import pytest

from worker.supervise import exit_state
from worker.trainer.exits import EXIT_FAILED, EXIT_OK, EXIT_OOM, EXIT_PREEMPTED, EXIT_STOPPED, says_out_of_memory


@pytest.mark.parametrize("text", [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "549755813888 bytes. Error code 12 (Cannot allocate memory)",
    "out of memory on rank 1: tried to allocate 512.00 GiB (RuntimeError)",
    "torch.OutOfMemoryError: HIP Out Of Memory",
])
def test_out_of_memory_is_recognised_however_it_is_worded(text):
    assert says_out_of_memory(text)
    assert exit_state(EXIT_FAILED, cancelled=False, log_tail=f"--- attempt 1 ---\n{text}") == "oom"


def test_other_failures_are_not_out_of_memory():
    assert not says_out_of_memory("rank 0: ValueError: memory_efficient_attention needs a mask")
    assert exit_state(EXIT_FAILED, cancelled=False, log_tail="rank 0: KeyError: 'x'") == "failed"
    assert exit_state(EXIT_OOM, cancelled=False, log_tail="") == "oom"
    assert exit_state(EXIT_OK, cancelled=False, log_tail="") == "succeeded"
    assert exit_state(EXIT_PREEMPTED, cancelled=True, log_tail="out of memory") == "cancelled"
    assert exit_state(EXIT_STOPPED, cancelled=False, log_tail="out of memory") == "stopped"  # a stop rule fired


def test_a_rank_failure_is_one_line_and_its_exit_code(tmp_path):
    """train.failed, the one ladder of the trainer's and the probe's ranks: out of memory however torch raises it,
    anything else as `rank R: Type: first line`, written to the run's error file."""
    import torch

    from worker.trainer.train import failed

    assert failed(tmp_path, 0, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")) == EXIT_OOM
    assert failed(tmp_path, 1, RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                            "549755813888 bytes")) == EXIT_OOM
    assert failed(tmp_path, 1, ValueError("bad plan\nsecond line")) == EXIT_FAILED
    assert (tmp_path / "error.txt").read_text().splitlines() == [
        "out of memory on rank 0: tried to allocate 2.00 GiB (OutOfMemoryError)",
        "out of memory on rank 1: tried to allocate 512.00 GiB (RuntimeError)",
        "rank 1: ValueError: bad plan"]
