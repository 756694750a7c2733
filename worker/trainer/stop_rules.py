"""The trainer checks the NaN and divergence stop rules itself, at each step end (plan/guardrails.py: the same
definitions the API's alerts use), so a run that goes wrong stops on the step the rule fires, not a metrics ship and
a heartbeat later (8 to ~39 tiny CPU steps; on a cluster, the next step of 32 GPUs).

Every rank decides the same: the step's loss is the all-gathered sum (worker/trainer/callbacks.py) and the grad norm
is DeepSpeed's global one, identical on every rank. A firing rule whose `run.stop_on_*` is on saves a checkpoint and
ends training after this step, like a SIGTERM (callbacks.STOP); rank 0 writes the alert to RUN_DIR/stopped.json and
every rank exits EXIT_STOPPED with the reason "stopped: <what> (<message>)" (train.py). The worker records the same
alert row and ends the run `stopped` (backend/runs/alerts.trainer_stopped); a rule that is off stops nothing here
(the API still raises its alert). One Guard lives for one trainer process, which is one attempt: the rules re-arm on
every attempt, and a resumed one starts its divergence rule from the reference the checkpoint it resumed from
carries (plan/guardrails.GUARD_FILE, written into every checkpoint here).

The checkpoints of a run that diverged: each one's record says whether its step's loss was within the rule's bounds,
and the newest such one is kept from the Trainer's rotation (`run.keep_checkpoints`) beside the newer ones, so the
run offers a checkpoint from before the divergence next to the one its stop saved."""
from __future__ import annotations

import json
from pathlib import Path

from plan.guardrails import GUARD_FILE, Divergence, guard_record, non_finite, read_guard_record, stop_reason
from plan.outcome import Cause

STOPPED_FILE = "stopped.json"  # {"kind", "step", "message", "reason", "attempt"}


class Guard:
    """The attempt's stop rules, as the plan's run section sets them; `fired` is (kind, step, message) once one has
    stopped the run."""

    def __init__(self, run_section, inherited: float | None = None):
        self.stop_on_nan = bool(run_section.stop_on_nan)
        self.stop_on_divergence = bool(run_section.stop_on_divergence)
        self.divergence = Divergence(run_section.divergence_factor, inherited=inherited)
        self.fired: tuple[str, int, str] | None = None
        self.last: tuple[int, float] | None = None  # (step, loss) last observed

    def observe(self, step: int, loss: float, grad_norm: float | None) -> tuple[str, int, str] | None:
        """Check this step's figures; answers (kind, step, message) of a rule that stops the run, else None."""
        if self.fired is not None:
            return self.fired
        self.last = (step, loss)
        for name, value in (("loss", loss), ("grad_norm", grad_norm)):
            bad = non_finite(name, value, step) if value is not None else None
            if bad is not None:
                if self.stop_on_nan:
                    self.fired = (bad[0], step, bad[1])
                self.divergence.within = False
                return self.fired  # the NaN rule is the one that speaks for this step
        message = self.divergence.observe(step, loss)
        if message is not None and self.stop_on_divergence:
            self.fired = ("loss_diverged", step, message)
        return self.fired

    @property
    def cause(self) -> Cause:
        """The outcome's cause (plan/outcome.py) of the rule that fired."""
        kind = self.fired[0] if self.fired else ""
        return Cause.DIVERGED if kind == "loss_diverged" else Cause.NAN if kind.endswith("_nan") else Cause.STOPPED

    @property
    def reason(self) -> str | None:
        return stop_reason(self.fired[0], self.fired[2]) if self.fired else None

    def write(self, run_dir: Path, attempt: int) -> None:
        """RUN_DIR/stopped.json: what the worker records as the run's alert (rank 0 only)."""
        if self.fired is None:
            return
        kind, step, message = self.fired
        (Path(run_dir) / STOPPED_FILE).write_text(json.dumps(
            {"kind": kind, "step": step, "message": message, "reason": self.reason, "attempt": attempt}))


    def record(self, checkpoint_dir: Path) -> None:
        """Write the GUARD_FILE of the checkpoint saved after the last observed step (rank 0)."""
        if self.last is not None:
            (Path(checkpoint_dir) / GUARD_FILE).write_text(guard_record(*self.last, self.divergence))


def inherited_reference(checkpoint_dir: Path | None) -> float | None:
    """The run's lowest loss up to checkpoint `checkpoint_dir` (its GUARD_FILE), or None (no checkpoint, or one
    saved without a record)."""
    found = read_guard_record(checkpoint_dir) if checkpoint_dir is not None else None
    return found["low"] if found else None


def newest_within_bounds(stage_dir: Path) -> str | None:
    """The newest checkpoint of a stage's directory whose record says its step's loss was within bounds, or None."""
    found = [(int(ck.name.rsplit("-", 1)[1]), ck) for ck in Path(stage_dir).glob("checkpoint-*")
             if ck.name.rsplit("-", 1)[1].isdigit() and (read_guard_record(ck) or {}).get("within")]
    return str(max(found)[1]) if found else None


def read_stopped(run_dir: Path, attempt: int) -> dict | None:
    """The alert the trainer of `attempt` stopped on (RUN_DIR/stopped.json), or None."""
    try:
        found = json.loads((Path(run_dir) / STOPPED_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("attempt") != attempt:
        return None
    return found
