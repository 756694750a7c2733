"""A run's checkpoints on disk (RUN_DIR/checkpoints/<stage>/checkpoint-<step>) and what the trainer recorded in
each (plan/guardrails.GUARD_FILE: its step's loss, whether that loss was within the divergence rule's bounds, and the
run's lowest loss up to it). The worker's run directory is shared with the API (one machine or a shared
filesystem)."""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from plan.guardrails import read_guard_record


def list_checkpoints(run_dir: str | None) -> list[dict]:
    """Stage, step, size, time, the step's loss and whether it had diverged: the checkpoints from before a
    divergence first, then the diverged ones (the stop's), each newest first. A checkpoint without a record (saved
    by an older trainer) counts as not diverged, its loss unknown."""
    root = Path(run_dir) / "checkpoints" if run_dir else None
    if root is None or not root.is_dir():
        return []
    out = []
    for ckpt in root.glob("*/checkpoint-*"):
        step = ckpt.name.removeprefix("checkpoint-")
        if not ckpt.is_dir() or not step.isdigit():
            continue
        files = [f for f in ckpt.rglob("*") if f.is_file()]
        record = read_guard_record(ckpt) or {}
        out.append({"name": f"{ckpt.parent.name}-{ckpt.name}", "stage": ckpt.parent.name, "step": int(step),
                    "bytes": sum(f.stat().st_size for f in files),
                    "saved_at": datetime.fromtimestamp(ckpt.stat().st_mtime, UTC),
                    "complete": (ckpt / "trainer_state.json").is_file(),
                    "loss": record.get("loss"), "diverged": record.get("within") is False})
    return sorted(out, key=lambda c: (not c["diverged"], c["saved_at"], c["step"]), reverse=True)


def newest_complete(run_dir: str | None) -> str | None:
    """stage<i>/checkpoint-<step> of the newest complete checkpoint (what a resume without a named one takes, as
    worker/trainer/checkpoints.latest_checkpoint finds it), or None."""
    def key(c: dict) -> tuple[int, int]:
        return int(c["stage"].removeprefix("stage") or 0), c["step"]

    done = [c for c in list_checkpoints(run_dir) if c["complete"] and c["stage"].removeprefix("stage").isdigit()]
    best = max(done, key=key, default=None)
    return f"{best['stage']}/checkpoint-{best['step']}" if best else None


def inherited_reference(run_dir: str | None, ref: str | None) -> float | None:
    """The divergence reference an attempt resuming from checkpoint `ref` (None: the newest) inherits: the run's
    lowest loss up to it, as its record says (None: no checkpoint, or one without a record)."""
    ref = ref or newest_complete(run_dir)
    if not run_dir or ref is None:
        return None
    found = read_guard_record(Path(run_dir) / "checkpoints" / ref)
    return found["low"] if found else None
