"""How the probe's launcher reads one launch's depths (worker/probe.py): what each depth's directory says (done, a
failure, out of memory, not reached), and the per-step breakdown read from the trainer's metrics records when they
carry it. The launch itself runs in tests/integration/test_probe.py."""
from __future__ import annotations

import json

from plan.outcome import OUTCOME_FILE, Cause, Outcome, write_outcome
from worker.probe import breakdown, depth_outcome, read_depth
from worker.trainer.probe_layout import DONE


def test_a_depth_says_done_failed_oom_or_nothing(tmp_path):
    assert depth_outcome(tmp_path) is None  # not reached: the launch ended before it
    write_outcome(tmp_path, Outcome.of(Cause.ERROR, "rank 1: RuntimeError: boom"), paths=[tmp_path / OUTCOME_FILE])
    assert depth_outcome(tmp_path) == ("failed", "rank 1: RuntimeError: boom")
    write_outcome(tmp_path, Outcome.of(Cause.OOM, "rank 0 ran short"), paths=[tmp_path / OUTCOME_FILE])
    assert depth_outcome(tmp_path) == ("oom", "rank 0 ran short")  # the record's cause, whatever its words
    (tmp_path / DONE).write_text("ok\n")
    assert depth_outcome(tmp_path) == ("ok", None)


def _record(step: int, **extra) -> dict:
    return {"step": step, "loss": 5.0, "step_time_s": 0.1 * step, "tokens_per_s": 100.0,
            "peak_allocated_gib": [0.5, 0.6], "peak_reserved_gib": [None, None], "gpu_mem_used_gib": [None, None],
            **extra}


def test_the_breakdown_is_read_when_the_records_carry_it(tmp_path):
    rows = [_record(s, forward_s=0.01 * s, backward_s=0.02 * s, optimizer_s=0.003) for s in (1, 2, 3, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = read_depth(tmp_path, 2)
    # the first step dropped: the medians of steps 2-4
    assert got["breakdown_s"] == {"forward_s": 0.03, "backward_s": 0.06, "optimizer_s": 0.003}
    assert [r["peak_allocated_gib"] for r in got["ranks"]] == [0.5, 0.6]
    assert got["steps_kept"] == 3


def test_records_without_the_parts_give_no_breakdown(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(_record(s)) + "\n" for s in (1, 2, 3)))
    assert read_depth(tmp_path, 2)["breakdown_s"] is None
    assert breakdown([{"forward_s": 0.2}]) == {"forward_s": 0.2, "backward_s": None, "optimizer_s": None}
