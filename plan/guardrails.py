"""The stop rules that both the API (backend/alerts/service.py, at metric ingest) and the trainer
(worker/trainer/stop_rules.py, at each step end) check, defined once here: a NaN/Inf loss or grad norm, and a diverging
loss. Pure functions, a small state object and the reader of a checkpoint's record: the API keeps the divergence
reference of the live attempt on the run row (it sees the steps in batches), the trainer in its process (one process
is one attempt, so the rules re-arm on every attempt in both places).

A resumed attempt inherits the run's reference: every checkpoint carries a GUARD_FILE with the run's lowest loss up
to its step (and whether that step's loss was within the rule's bounds), and the attempt that resumes from it starts
its divergence rule from that loss (`Divergence.inherited`), so a loss that never comes back within the factor of
where the run had been fires again, however the resume changed the learning rate. Both the trainer and the API read
the record of the checkpoint the attempt resumes from.

  loss_nan / grad_norm_nan  a loss or grad norm that is NaN/Inf (`run.stop_on_nan`, on by default);
  loss_diverged             from an attempt's DIVERGENCE_FROM-th step on, a loss above `run.divergence_factor` x the
                            attempt's running minimum (its lowest loss before that step, and the inherited
                            reference of the checkpoint it resumed from) (`run.stop_on_divergence`, on by default).

Both write the same kind, step and message for the same step, so the alert the trainer stops on and the one the API
raises from the shipped metrics are the same row (one of each kind per attempt)."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GUARD_FILE = "ulab_guard.json"  # in each checkpoint directory: {"step", "loss", "low", "within"} (guard_record)
DIVERGENCE_FROM = 3  # the attempt's first step at which the divergence rule may fire (steps 1-2: the reference)
WATCHED = ("loss", "grad_norm")  # the figures whose non-finite values raise `<name>_nan`
# how a stopping rule names itself in the run's exit reason ("stopped: <what> (<message>)")
WHAT = {"loss_nan": "loss is NaN/Inf", "grad_norm_nan": "grad_norm is NaN/Inf", "loss_diverged": "loss diverged",
        "grad_norm_exploded": "grad norm exploded", "throughput_dropped": "tokens/s dropped",
        "stalled": "no step arrived", "probe_failed": "smoke test failed"}


def stop_reason(kind: str, message: str) -> str:
    """The run's exit reason when rule `kind` stopped it."""
    return f"stopped: {WHAT[kind]} ({message})"


def non_finite(name: str, value: float, step: int) -> tuple[str, str] | None:
    """(kind, message) when `value` of a WATCHED figure is NaN/Inf at `step`, else None."""
    if name in WATCHED and not math.isfinite(value):
        return f"{name}_nan", f"{name} is {value} at step {step}"
    return None


@dataclass
class Divergence:
    """The divergence rule of one attempt: `observe` each finite loss in step order. `first_step` is the attempt's
    first step with a loss, `low` its lowest loss so far (None: no loss yet), seeded with `inherited` (the run's
    lowest loss up to the checkpoint the attempt resumed from; None: a fresh start or a checkpoint without a
    record). `within` is whether the last observed loss was within the rule's bounds."""

    factor: float
    first_step: int | None = None
    low: float | None = None
    inherited: float | None = None
    within: bool = True

    def __post_init__(self) -> None:
        if self.low is None and self.inherited is not None:
            self.low = self.inherited

    def observe(self, step: int, loss: float) -> str | None:
        """The message if this loss is above `factor` x the lowest loss before it (from the attempt's
        DIVERGENCE_FROM-th step on), else None; then the loss joins the reference. A NaN/Inf loss is ignored here
        (the NaN rule's) but is not within bounds."""
        if not math.isfinite(loss):
            self.within = False
            return None
        if self.first_step is None or step < self.first_step:
            self.first_step = step
        low, fired = self.low, None
        self.within = low is None or low <= 0 or loss <= self.factor * low
        if not self.within and low is not None and step >= self.first_step + DIVERGENCE_FROM - 1:
            whose = ("the run's lowest loss up to the checkpoint this attempt resumed from"
                     if low == self.inherited else "this attempt's lowest loss so far")
            fired = f"loss diverged: {loss:.4g} at step {step} is above {self.factor:g} x {whose} {low:.4g}"
        self.low = loss if low is None else min(low, loss)
        return fired


def guard_record(step: int, loss: float, rule: Divergence) -> str:
    """The GUARD_FILE text of a checkpoint saved after `step` (whose loss the rule observed last)."""
    return json.dumps({"step": step, "loss": loss if math.isfinite(loss) else None, "low": rule.low,
                       "within": rule.within})


def read_guard_record(checkpoint_dir: Path) -> dict | None:
    """The record ({"step", "loss", "low", "within"}) in checkpoint `checkpoint_dir`'s GUARD_FILE, or None (a
    checkpoint saved without one, or unreadable): the trainer's resume and the API's checkpoint list read it."""
    try:
        found = json.loads((Path(checkpoint_dir) / GUARD_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("within"), bool):
        return None
    low = found.get("low")
    return {**found, "low": float(low) if isinstance(low, (int, float)) and math.isfinite(low) else None}
