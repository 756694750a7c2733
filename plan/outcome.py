"""How an attempt ended, as one record: RUN_DIR/outcome.json, written by the trainer's ranks (the first failure
wins) and by the launcher (`ulab train`, last: its exit code is the attempt's), and read by everyone who asks how an
attempt ended: the worker's supervision (worker/supervise.py), a Slurm job and the API's Slurm poller, the probes and
the GPU check. The cause is decided once, where the failure happens; no reader looks for it in a log.

The exit codes of the trainer are declared here and nowhere else (the worker, the Slurm poller and the GPU check
import them): 0 completed; 1 failed (an error, or no space left on device); 2 bad plan or data; 3 out of memory;
75 stopped by a signal after saving a checkpoint (resume with --resume); 76 stopped by a stop rule (a NaN or
diverging loss, or another `run.stop_on_*` rule: worker/trainer/stop_rules.py) after saving a checkpoint.

Pure: the standard library only, so the trainer, the worker and the backend all read it.
"""
from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

OUTCOME_FILE = "outcome.json"
# A second place the record goes (a path outside the run directory, which the worker names): a full run disk
# cannot swallow it there.
OUTCOME_ENV = "ULAB_OUTCOME"

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_OOM, EXIT_PREEMPTED, EXIT_STOPPED = 0, 1, 2, 3, 75, 76


class Cause(StrEnum):
    COMPLETED = "completed"
    OOM = "oom"
    DIVERGED = "diverged"  # the divergence stop rule
    NAN = "nan"  # the NaN stop rule
    STOPPED = "stopped"  # another stop rule
    SIGNAL = "signal"  # stopped (SIGTERM: checkpoint saved) or killed by a signal
    ERROR = "error"
    NO_SPACE = "no_space"


# The exit code each cause ends `ulab train` with (a signal's, when a rank saved a checkpoint and stopped).
EXIT_CODE = {Cause.COMPLETED: EXIT_OK, Cause.OOM: EXIT_OOM, Cause.DIVERGED: EXIT_STOPPED, Cause.NAN: EXIT_STOPPED,
             Cause.STOPPED: EXIT_STOPPED, Cause.SIGNAL: EXIT_PREEMPTED, Cause.ERROR: EXIT_FAILED,
             Cause.NO_SPACE: EXIT_FAILED}
STOP_RULES = frozenset({Cause.DIVERGED, Cause.NAN, Cause.STOPPED})


@dataclass(frozen=True)
class Outcome:
    cause: Cause
    exit_code: int
    message: str = ""
    step: int | None = None  # the last step the attempt completed, where known
    rank: int | None = None  # the rank that wrote it (None: the launcher)
    attempt: int | None = None

    @classmethod
    def of(cls, cause: Cause, message: str = "", **fields) -> Outcome:
        """A record with the cause's own exit code (a bad plan's is EXIT_BAD_INPUT: pass exit_code)."""
        return cls(cause=cause, exit_code=fields.pop("exit_code", EXIT_CODE[cause]), message=message, **fields)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "cause": self.cause.value})

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        return cls(cause=Cause(data["cause"]), exit_code=int(data["exit_code"]), message=str(data.get("message", "")),
                   step=data.get("step"), rank=data.get("rank"), attempt=data.get("attempt"))


def outcome_paths(run_dir: Path) -> list[Path]:
    """Where the record is written and read: the run directory's, then the one the worker named (OUTCOME_ENV)."""
    extra = os.environ.get(OUTCOME_ENV)
    return [Path(run_dir) / OUTCOME_FILE] + ([Path(extra)] if extra else [])


def write_outcome(run_dir: Path, outcome: Outcome, first: bool = False, paths: list[Path] | None = None) -> bool:
    """Write the record to each of its places (atomically: a reader never sees half of one); with `first`, only
    where none is written yet (the first failing rank's word stands). Never raises (a full disk fails one place,
    not the other); answers whether some place has it."""
    written = False
    for path in paths or outcome_paths(run_dir):
        try:
            if first:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "w") as f:
                    f.write(outcome.to_json())
            else:
                tmp = path.with_name(f".{path.name}.{os.getpid()}")
                tmp.write_text(outcome.to_json())
                os.replace(tmp, path)
            written = True
        except FileExistsError:
            written = True
        except OSError:
            continue
    return written


def read_outcome(run_dir: Path, paths: list[Path] | None = None) -> Outcome | None:
    """The attempt's record from the first place that has a readable one; None if none does."""
    for path in paths or outcome_paths(run_dir):
        try:
            return Outcome.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def clear_outcome(run_dir: Path, paths: list[Path] | None = None) -> None:
    """Remove an earlier attempt's record before an attempt starts."""
    for path in paths or outcome_paths(run_dir):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


def describe_exit(code: int) -> str:
    """A process's return code in words: "exit code 1", or "killed by SIGKILL" for a negative (signal) code."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def without_record(code: int) -> Outcome:
    """An attempt that ended with `code` and left no record (killed before it could write one): its cause from the
    code alone, and no message."""
    if code == EXIT_OK:
        return Outcome.of(Cause.COMPLETED)
    return Outcome(Cause.SIGNAL if code < 0 else Cause.ERROR, code)
