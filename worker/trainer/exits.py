"""The trainer's exit codes and how an out-of-memory failure is recognised, in one place: the trainer returns
them, `ulab train` maps a rank's failure line onto them, and the worker maps them onto a run's final state.

0 done; 1 training failed; 2 bad plan or data; 3 out of memory; 75 stopped by SIGTERM after saving a
checkpoint (resume with --resume); 76 stopped by a stop rule (`run.stop_on_nan` / `run.stop_on_divergence`, checked
by the trainer at each step end: worker/trainer/guard.py) after saving a checkpoint, the alert in RUN_DIR/stopped.json.
"""
from __future__ import annotations

import os
import re
import signal
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_OOM, EXIT_PREEMPTED, EXIT_STOPPED = 0, 1, 2, 3, 75, 76

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


# --- why a run failed, in words -----------------------------------------------------------------------------------
# Known causes, most telling first: the first that any line of the attempt's log (or its last words) shows becomes
# the first line of the run's reason. A full disk makes every rank fail in its own way (a write, then a collective
# with a dead peer), so the cause is searched in the whole attempt, not in the last lines.
_NO_SPACE = re.compile(r"no space left on device|\[Errno 28\]|\bENOSPC\b", re.IGNORECASE)
_NO_TOKENIZER = re.compile(r"has no tokenizer|can't load tokenizer|couldn't instantiate the backend tokenizer",
                           re.IGNORECASE)
_TORCHRUN_KILLED = re.compile(r"torchrun (?:was )?killed by (SIG[A-Z0-9]+|signal \d+)")
_PREFIX = re.compile(r"^(?:\[rank\d+\]:\s*|error:\s*)+")
# The trainer's last words also go here (a path the worker sets, outside the run directory): they survive a run
# directory whose disk is full, where train.log and error.txt cannot be written.
LAST_WORDS_ENV = "ULAB_LAST_WORDS"


def _cause_of(line: str) -> tuple[int, str] | None:
    """(priority, reason) of a line that shows a known cause; lower priority numbers win."""
    if _NO_SPACE.search(line):
        return 0, "no space left on device: the disk of the run directory is full"
    if says_out_of_memory(line):
        return 1, _PREFIX.sub("", line.strip())[:300]
    if _NO_TOKENIZER.search(line):
        return 2, "the checkpoint has no tokenizer that loads (tokenizer.json or tokenizer.model under run.model_path)"
    m = _TORCHRUN_KILLED.search(line)
    if m:
        return 3, f"torchrun was killed by {m.group(1)}"
    return None


def known_cause(lines) -> str | None:
    """The most telling known cause that `lines` show (ENOSPC, out of memory, a missing tokenizer, a killed
    torchrun), as one line in words; None if none."""
    best: tuple[int, str] | None = None
    for line in lines:
        found = _cause_of(line)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
            if best[0] == 0:
                break
    return best[1] if best else None


def attempt_lines(log_path: Path, last_words: Path | None = None):
    """Every line of the log's last attempt (from its last `--- attempt` / `--- slurm job` marker), then the
    last words; streamed, so a long log is never held in memory."""
    section: list[str] = []
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                if line.startswith(("--- attempt ", "--- slurm job ")):
                    section = []
                elif _cause_of(line) is not None:
                    section.append(line)  # only lines with a cause are kept
    except OSError:
        pass
    yield from section
    if last_words is not None:
        try:
            yield from last_words.read_text(errors="replace").splitlines()
        except OSError:
            pass


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
