"""Alerts raised at metric ingest: a loss or grad norm that is NaN/Inf, and a loss that diverged (above
`run.divergence_factor` x its early minimum). One alert of each kind per run, kept in run_alerts; a rule whose
`run.stop_on_*` field is on also stops the run (transitions.request_stop: cancel, the trainer saves a checkpoint
on SIGTERM) with the reason "stopped: ...".

The early minimum is the lowest loss of the first EARLY_STEPS steps: a healthy run's loss stays below a few times
it (cross-entropy starts near ln(vocab) and goes down), while a diverging one grows by orders of magnitude (the
issue's lr=10 run: 6.2 -> about 5000, 800x)."""
from __future__ import annotations

import math

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.metrics.models import MetricPoint
from backend.metrics.schemas import PointIn
from backend.runs import transitions
from backend.runs.alert_rows import RunAlert
from backend.runs.models import Run
from backend.runs.states import ACTIVE, RunState
from plan.model import RunSection

EARLY_STEPS = 10
WATCHED = ("loss", "grad_norm")  # the only names whose non-finite values are accepted (and alerted, not stored)


def _rules(run: Run) -> RunSection:
    return RunSection.model_validate((run.spec or {}).get("run") or {"data": {"path": "-"}}, strict=False)


def check(session: Session, run_id: int, points: list[PointIn]) -> list[RunAlert]:
    """Alerts the batch raises (stored in the session, not committed); stops the run where the rule says so. Also
    records what the run ran on (its device) from the trainer's `on_gpu` point, and its latest loss."""
    run = session.get(Run, run_id)
    if run is None or not points:
        return []
    rules = _rules(run)
    last = max((p for p in points if p.name == "loss" and p.rank == 0 and math.isfinite(p.value)),
               key=lambda p: p.step, default=None)
    if last is not None and (run.final_loss_step is None or last.step >= run.final_loss_step):
        run.final_loss, run.final_loss_step = last.value, last.step
    device = next((p.value for p in points if p.name == "on_gpu"), None)
    if device is not None and run.device is None:  # the trainer's "on_gpu" (1: CUDA, 0: CPU ranks)
        run.device = "cuda" if device else "cpu"
    found: list[tuple[str, int, str, bool]] = []
    for p in sorted(points, key=lambda p: p.step):
        if p.name in WATCHED and not math.isfinite(p.value):
            found.append((f"{p.name}_nan", p.step, f"{p.name} is {p.value} at step {p.step}", rules.stop_on_nan))
            break
    losses = [p for p in points if p.name == "loss" and math.isfinite(p.value)]
    if losses:
        early = [p.value for p in losses if p.step <= EARLY_STEPS]
        stored = session.scalar(select(func.min(MetricPoint.value)).where(
            MetricPoint.run_id == run_id, MetricPoint.name == "loss", MetricPoint.step <= EARLY_STEPS))
        early_min = min([*early, *([stored] if stored is not None else [])], default=None)
        if early_min is not None and early_min > 0:
            worst = max((p for p in losses if p.step > EARLY_STEPS), key=lambda p: p.value, default=None)
            if worst is not None and worst.value > rules.divergence_factor * early_min:
                found.append(("loss_diverged", worst.step,
                              f"loss diverged: {worst.value:.4g} at step {worst.step} is above "
                              f"{rules.divergence_factor:g} x its early minimum {early_min:.4g}",
                              rules.stop_on_divergence))
    have = set(session.scalars(select(RunAlert.kind).where(RunAlert.run_id == run_id)))
    raised = []
    for kind, step, message, stop in found:
        if kind in have:
            continue
        stopping = stop and RunState(run.state) in ACTIVE and not run.cancel_requested
        if stopping:
            what = "loss diverged" if kind == "loss_diverged" else f"{kind.removesuffix('_nan')} is NaN/Inf"
            transitions.request_stop(run, f"stopped: {what} ({message})")
        alert = RunAlert(run_id=run_id, kind=kind, step=step, message=message, stopped=stopping)
        session.add(alert)
        raised.append(alert)
    return raised


