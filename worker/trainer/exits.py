"""What the trainer's processes decide about their own failure, where it happens: the cause of an exception (out of
memory, no space left on device, a tokenizer that does not load) and its one line, for the attempt's outcome record
(plan/outcome.py, which also declares the exit codes; they are re-exported here for the trainer's modules). Nobody
reads a cause back from a log: the record says it.
"""
from __future__ import annotations

import errno
import os
import re

from plan.outcome import (  # noqa: F401  (re-exported for the trainer's modules)
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_OOM,
    EXIT_PREEMPTED,
    EXIT_STOPPED,
    Cause,
    describe_exit,
)

# CUDA's "CUDA out of memory", the trainer's own "out of memory on rank R", and the CPU allocator's
# "DefaultCPUAllocator: can't allocate memory".
OOM_MARKERS = ("out of memory", "can't allocate memory")
_NO_SPACE = re.compile(r"no space left on device|\[Errno 28\]|\bENOSPC\b", re.IGNORECASE)
_NO_TOKENIZER = re.compile(r"has no tokenizer|can't load tokenizer|couldn't instantiate the backend tokenizer",
                           re.IGNORECASE)
NO_SPACE_MESSAGE = "no space left on device: the disk of the run directory is full"
NO_TOKENIZER_MESSAGE = ("the checkpoint has no tokenizer that loads (tokenizer.json or tokenizer.model under "
                        "run.model_path)")
# The trainer's last words also go here (a path the worker sets, outside the run directory): they survive a run
# directory whose disk is full, where train.log cannot be written.
LAST_WORDS_ENV = "ULAB_LAST_WORDS"


def says_out_of_memory(text: str) -> bool:
    """Whether an exception's message reports running out of (GPU or CPU) memory."""
    low = text.lower()
    return any(marker in low for marker in OOM_MARKERS)


def no_space(e: BaseException) -> bool:
    """Whether an exception (or one it was raised from) is a write that found the disk full."""
    seen: BaseException | None = e
    while seen is not None:
        if (isinstance(seen, OSError) and seen.errno == errno.ENOSPC) or _NO_SPACE.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def error_cause(e: BaseException, line: str) -> tuple[Cause, str]:
    """The cause and the one line of a failure that is not out of memory: no space left, a tokenizer that does not
    load (both in words), else an error with `line`."""
    if no_space(e):
        return Cause.NO_SPACE, NO_SPACE_MESSAGE
    if _NO_TOKENIZER.search(str(e)):
        return Cause.ERROR, NO_TOKENIZER_MESSAGE
    return Cause.ERROR, line


def say_last_words(line: str) -> None:
    """Append a failure line to the last-words file the worker named (LAST_WORDS_ENV), if any; never raises."""
    path = os.environ.get(LAST_WORDS_ENV)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(line.replace("\n", " ")[:2000] + "\n")
    except OSError:
        pass
