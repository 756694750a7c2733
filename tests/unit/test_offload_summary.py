"""The trainer's end-of-run checkpoint-offload line and the one pattern its readers use (worker/trainer/
offload_summary.py). `make gpu-check` read the line with a pattern of an older wording and, on the H100 check,
failed its ALST row with "no checkpoint-offload line" whatever the trainer had done."""
from __future__ import annotations

from worker.trainer.modeling import checkpoint_offloader
from worker.trainer.offload_summary import LINE, PREFIX, format_line, read_lines


def test_the_pattern_reads_back_what_the_trainer_prints():
    line = format_line(8, 8, 6, 3 * 2**30, 1, 1)
    assert line.startswith(PREFIX)
    assert read_lines(f"step 4\n{line}\nexit 0\n") == [
        {"marked": 8, "taken": 8, "offloaded": 6, "gib": 3.0, "kept_last": 1, "in_place": 1}]


def test_the_offload_engines_own_summary_is_that_line():
    offload = checkpoint_offloader(True)  # DeepSpeed's engine, as the trainer builds it
    with offload:
        pass
    assert LINE.fullmatch(offload.summary()), offload.summary()
    assert read_lines(offload.summary())[0]["marked"] == 0
