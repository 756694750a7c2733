"""The trainer's exit codes and how an out-of-memory failure is recognised, in one place: the trainer returns
them, `ulab train` maps a rank's failure line onto them, and the worker maps them onto a run's final state.

0 done; 1 training failed; 2 bad plan or data; 3 out of memory; 75 stopped by SIGTERM after saving a
checkpoint (resume with --resume).
"""
from __future__ import annotations

import signal

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_OOM, EXIT_PREEMPTED = 0, 1, 2, 3, 75

# CUDA's "CUDA out of memory", the trainer's own "out of memory on rank R", and the CPU allocator's
# "DefaultCPUAllocator: can't allocate memory".
OOM_MARKERS = ("out of memory", "can't allocate memory")


def says_out_of_memory(text: str) -> bool:
    """Whether an error message or a log tail reports running out of (GPU or CPU) memory."""
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


def describe_exit(code: int) -> str:
    """A process's return code in words: "exit code 1", or "killed by SIGKILL" for a negative (signal) code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
