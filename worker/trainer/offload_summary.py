"""The line a rank-0 trainer prints at the end of a run with activation-checkpoint offload (offload.py), and the
pattern that reads it back: the integration tests and `make gpu-check` (bench/gpu_check_run.py) read the line with
this one pattern, so a change of wording cannot leave a reader matching nothing. No torch here: the GPU check's
reader imports it without the trainer."""
from __future__ import annotations

import re

PREFIX = "checkpoint offload, last micro batch: "
LINE = re.compile(re.escape(PREFIX) + r"(?P<marked>\d+) checkpointed layer inputs marked, (?P<taken>\d+) taken by "
                  r"their checkpoints \((?P<offloaded>\d+) offloaded, (?P<gib>[\d.]+) GiB to host; (?P<kept_last>\d+) "
                  r"newest kept on the device; (?P<in_place>\d+) kept in place\)")


def format_line(marked: int, taken: int, offloaded: int, offloaded_bytes: int, kept_last: int, in_place: int) -> str:
    """The whole line, PREFIX included."""
    return (f"{PREFIX}{marked} checkpointed layer inputs marked, {taken} taken by their checkpoints ({offloaded} "
            f"offloaded, {offloaded_bytes / 1024**3:.3f} GiB to host; {kept_last} newest kept on the device; "
            f"{in_place} kept in place)")


def read_lines(text: str) -> list[dict[str, float]]:
    """Every such line in `text` (a console log), as numbers."""
    return [{k: float(v) for k, v in m.groupdict().items()} for m in LINE.finditer(text)]
