"""The stop rules that both the API (backend/alerts/service.py, at metric ingest) and the trainer
(worker/trainer/guard.py, at each step end) check, defined once here: a NaN/Inf loss or grad norm, and a diverging
loss. Pure functions and a small state object, no I/O: the API keeps the divergence reference of the live attempt on
the run row (it sees the steps in batches), the trainer in its process (one process is one attempt, so the rules
re-arm on every attempt in both places).

  loss_nan / grad_norm_nan  a loss or grad norm that is NaN/Inf (`run.stop_on_nan`, on by default);
  loss_diverged             from an attempt's DIVERGENCE_FROM-th step on, a loss above `run.divergence_factor` x the
                            attempt's running minimum (its lowest loss before that step) (`run.stop_on_divergence`,
                            on by default).

Both write the same kind, step and message for the same step, so the alert the trainer stops on and the one the API
raises from the shipped metrics are the same row (one of each kind per attempt)."""
from __future__ import annotations

import math
from dataclasses import dataclass

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
    first step with a loss, `low` its lowest loss so far (None: no loss yet)."""

    factor: float
    first_step: int | None = None
    low: float | None = None

    def observe(self, step: int, loss: float) -> str | None:
        """The message if this loss is above `factor` x the lowest loss before it (from the attempt's
        DIVERGENCE_FROM-th step on), else None; then the loss joins the reference. A NaN/Inf loss is ignored here
        (the NaN rule's)."""
        if not math.isfinite(loss):
            return None
        if self.first_step is None or step < self.first_step:
            self.first_step = step
        low, fired = self.low, None
        if (low is not None and low > 0 and step >= self.first_step + DIVERGENCE_FROM - 1
                and loss > self.factor * low):
            fired = (f"loss diverged: {loss:.4g} at step {step} is above {self.factor:g} x this attempt's lowest "
                     f"loss so far {low:.4g}")
        self.low = loss if low is None else min(low, loss)
        return fired
