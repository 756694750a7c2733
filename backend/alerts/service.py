"""Alerts of a run, one of each kind per run, kept in run_alerts. Raised at metric ingest (`check`):

  loss_nan / grad_norm_nan  a loss or grad norm that is NaN/Inf (`run.stop_on_nan`, on by default);
  loss_diverged             from an attempt's DIVERGENCE_FROM-th step on, a loss above `run.divergence_factor` x
                            the attempt's running minimum (its lowest loss before that step) (`run.stop_on_divergence`,
                            on by default);
  grad_norm_exploded        a grad norm above `run.grad_norm_factor` x its median over the previous HISTORY steps;
  throughput_dropped        tokens/s below `run.throughput_floor` x the run's median for SUSTAIN steps in a row (on
                            CPU ranks, below CPU_JITTER_FLOOR x it, if that is lower);

  probe_failed              the smoke-test gate (`run.probe`): in the first `probe.steps` steps a rank's peak memory
                            above `max_memory_fraction` of the GPU's, a NaN/Inf loss (`require_finite_loss`), or at
                            the last checked step a median tokens/s below `min_tokens_per_s_fraction` of the
                            planner's; it always stops the run (that is what the gate is for);

and by the API's supervision loop (`check_stalls`, backend/execution/reaper.py):

  stalled                   a running run with no step for `run.stall_after_s` seconds.

Each rule is a `Rule` of RULES (below). A rule whose `run.stop_on_*` field is on also stops the run
(transitions.request_stop: the trainer saves a checkpoint on SIGTERM) and the run ends `stopped` with the reason
"stopped: ...". Every rule re-arms on every attempt: alerts are one of each kind per attempt. The divergence reference
is the run's lowest loss up to the checkpoint the attempt resumed from (its record, plan/guardrails.GUARD_FILE), then
the attempt's own: a resume with a smaller learning rate from a diverged checkpoint whose loss never comes back
within the factor of where the run had been is stopped again, on the attempt's DIVERGENCE_FROM-th step.

The divergence rule compares each loss with the attempt's running minimum: a healthy run's loss stays below a few
times it (cross-entropy starts near ln(vocab) and goes down, and the minimum only falls), while a diverging one grows
by orders of magnitude (the issue's lr=10 run: 6.2 -> 849 -> 3,112, so it fires at the attempt's third step, before
GPU hours go). Two steps are the fewest that give a reference that is not the untrained first loss alone.
The grad-norm and throughput rules compare with a median, which one
odd step does not move; they wait for MIN_HISTORY steps, and the throughput rule for SUSTAIN slow steps in a row, so
the slow first step of an attempt or a step that also saved a checkpoint raises nothing.

The NaN and divergence rules are defined once, in plan/guardrails.py: the trainer checks them too, at each step end,
and stops itself the same step (worker/trainer/stop_rules.py); its worker then records the same alert
(`trainer_stopped`), one row whichever side sees it first."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from backend.alerts.models import RunAlert
from backend.core.db import session_scope
from backend.metrics.models import MetricPoint
from backend.metrics.schemas import PointIn
from backend.runs import transitions
from backend.runs.models import Run
from backend.runs.states import ACTIVE, RunState
from plan.guardrails import DIVERGENCE_FROM, WATCHED, WHAT, Divergence, non_finite, stop_reason
from plan.model import RunSection

__all__ = ["DIVERGENCE_FROM", "WATCHED", "WHAT", "check", "check_stalls", "trainer_stopped"]

HISTORY = 100  # steps the grad-norm and throughput medians look back over
MIN_HISTORY = 10  # steps needed before either compares with its median
SUSTAIN = 5  # slow steps in a row before tokens/s counts as dropped
# The trainer's and the database's clocks may differ by this much (NTP keeps them far closer); an attempt starts at
# least a model load after its predecessor's last step
ATTEMPT_CLOCK_SLACK_S = 1.0
# CPU ranks share their cores with whatever else the machine runs: a healthy tiny CPU run's best tokens/s over SUSTAIN
# steps in a row fell to 0.21 x its median before them (bench/cpu_step_jitter.py, bench/results/cpu-step-jitter.md),
# where the default floor is 0.5. On CPU ranks the rule compares with half the lowest measured, so jitter alone
# never fires it; a drop deeper than that still does.
CPU_JITTER_FLOOR = 0.1
MEMORY_POINTS = ("peak_allocated_gib", "peak_reserved_gib", "gpu_mem_used_gib")  # per rank, GiB


def _rules(run: Run) -> RunSection:
    return RunSection.model_validate((run.spec or {}).get("run") or {"data": {"path": "-"}}, strict=False)


def _stored_before(session: Session, run_id: int, name: str, step: int, limit: int) -> list[float]:
    """The last `limit` stored rank-0 values of `name` before `step`, oldest first."""
    rows = session.scalars(select(MetricPoint.value).where(
        MetricPoint.run_id == run_id, MetricPoint.name == name, MetricPoint.rank == 0, MetricPoint.step < step)
        .order_by(MetricPoint.step.desc()).limit(limit))
    return list(rows)[::-1]


def _series(session: Session, run_id: int, points: list[PointIn], name: str, keep: int) -> tuple[list[float],
                                                                                                  list[PointIn]]:
    """(stored values before the batch, the batch's finite rank-0 points of `name` in step order)."""
    new = sorted((p for p in points if p.name == name and p.rank == 0 and math.isfinite(p.value)),
                 key=lambda p: p.step)
    if not new:
        return [], []
    return _stored_before(session, run_id, name, new[0].step, keep), new


@dataclass(frozen=True)
class Batch:
    """What a rule looks at: a batch of points of the run's live attempt, with the run and its rules."""

    session: Session
    run: Run
    points: list[PointIn]
    rules: RunSection


Finding = tuple[str, int, str]  # (alert kind, step, message in words)


@dataclass(frozen=True)
class Rule:
    """One rule of the table above: the alert kinds it raises (each once per attempt; how each names itself in a
    stopped run's exit reason is plan/guardrails.WHAT, which the trainer's own stop uses too), what finds it in a
    batch (None: raised by the supervision loop, `check_stalls`), and whether its alert stops the run."""

    kinds: tuple[str, ...]
    find: Callable[[Batch], Finding | None] | None
    stops: Callable[[RunSection], bool]
    # looked at even when its alert was raised already (the divergence rule keeps the attempt's reference current)
    always: bool = False


def _grad_norm_spike(session: Session, run_id: int, points: list[PointIn], factor: float):
    history, new = _series(session, run_id, points, "grad_norm", HISTORY)
    for p in new:
        recent = history[-HISTORY:]
        if len(recent) >= MIN_HISTORY:
            median = statistics.median(recent)
            if median > 0 and p.value > factor * median:
                return p.step, (f"grad norm exploded: {p.value:.4g} at step {p.step} is above {factor:g} x its "
                                f"median {median:.4g} over the previous {len(recent)} steps")
        history.append(p.value)
    return None


def _throughput_drop(session: Session, run_id: int, points: list[PointIn], floor: float):
    stored, new = _series(session, run_id, points, "tokens_per_s", HISTORY + SUSTAIN)
    values, steps = stored + [p.value for p in new], [None] * len(stored) + [p.step for p in new]
    for i in range(len(stored), len(values)):
        window, before = values[i - SUSTAIN + 1:i + 1], values[max(0, i - SUSTAIN - HISTORY + 1):i - SUSTAIN + 1]
        if len(window) < SUSTAIN or len(before) < MIN_HISTORY:
            continue
        median = statistics.median(before)
        if median > 0 and max(window) < floor * median:
            return steps[i], (f"tokens/s dropped: {window[-1]:.4g} at step {steps[i]}, and every one of the last "
                              f"{SUSTAIN} steps below {floor:g} x the run's median {median:.4g}")
    return None


def throughput_floor(run: Run, rules: RunSection) -> float:
    """The throughput rule's floor: the run's, and on CPU ranks no higher than CPU_JITTER_FLOOR."""
    return min(rules.throughput_floor, CPU_JITTER_FLOOR) if run.device == "cpu" else rules.throughput_floor


def _share(x: float) -> str:
    return f"{x:.0%}" if x >= 0.01 else f"{x:.2g}"


def _probe_breach(session: Session, run: Run, points: list[PointIn], gate) -> tuple[int, str] | None:
    """The first breach of the smoke-test gate in this batch: (step, reason in words), or None."""
    window = [p for p in points if p.step <= gate.steps]
    if not window:
        return None
    estimate = run.estimate or {}
    capacity = (estimate.get("memory") or {}).get("gpu_capacity_gib")
    if capacity:
        over = [p for p in window if p.name in MEMORY_POINTS and math.isfinite(p.value)
                and p.value > gate.max_memory_fraction * capacity]
        if over:
            p = max(over, key=lambda p: p.value)
            return p.step, (f"probe: rank {p.rank} peaked at {p.value:.3g} GiB, {_share(p.value / capacity)} of "
                            f"{capacity:g} (limit {_share(gate.max_memory_fraction)})")
    if gate.require_finite_loss:
        bad = next((p for p in sorted(window, key=lambda p: p.step) if p.name == "loss" and p.rank == 0
                    and not math.isfinite(p.value)), None)
        if bad is not None:
            return bad.step, f"probe: loss is {bad.value} at step {bad.step}"
    predicted = (estimate.get("throughput") or {}).get("tokens_per_s")
    last = [p for p in window if p.name == "tokens_per_s" and p.rank == 0 and p.step == gate.steps]
    if gate.min_tokens_per_s_fraction > 0 and predicted and last:
        new = {p.step: p.value for p in window if p.name == "tokens_per_s" and p.rank == 0}
        stored = {s: v for s, v in session.execute(select(MetricPoint.step, MetricPoint.value).where(
            MetricPoint.run_id == run.id, MetricPoint.name == "tokens_per_s", MetricPoint.rank == 0,
            MetricPoint.step <= gate.steps))}
        values = [v for s, v in sorted({**stored, **new}.items()) if (s > 1 or gate.steps == 1) and math.isfinite(v)]
        if values:
            tps = statistics.median(values)
            if tps < gate.min_tokens_per_s_fraction * predicted:
                return gate.steps, (f"probe: {tps:,.0f} tokens/s, {_share(tps / predicted)} of the predicted "
                                    f"{predicted:,.0f} (limit {_share(gate.min_tokens_per_s_fraction)})")
    return None


def this_attempts(run: Run, points: list[PointIn]) -> list[PointIn]:
    """The points the live attempt wrote. A new attempt's shipper sends every attempt's metrics file again, oldest
    first (worker/shipper.py), and the earlier attempts' points must not raise this attempt's alerts: a point written
    (its wall time, the trainer's clock) before this attempt started is an earlier attempt's. A point without a wall
    time counts as this attempt's."""
    started = run.started_at
    if started is None:
        return points
    since = transitions.as_utc(started).timestamp() - ATTEMPT_CLOCK_SLACK_S
    return [p for p in points if not p.wall_time or p.wall_time >= since]


def _divergence(run: Run, points: list[PointIn], factor: float) -> tuple[int, str] | None:
    """(step, message) of the batch's first loss above `factor` x the attempt's running minimum, from the attempt's
    DIVERGENCE_FROM-th step (plan/guardrails.Divergence), from the reference the attempt inherited from its checkpoint
    (transitions.queue_retry); updates the attempt's reference on the run (first loss step, lowest loss)."""
    rule = Divergence(factor, run.attempt_loss_first_step, run.attempt_loss_min, run.attempt_loss_inherited)
    fired = None
    for p in sorted((p for p in points if p.name == "loss" and p.rank == 0), key=lambda p: p.step):
        message = rule.observe(p.step, p.value)
        if fired is None and message is not None:
            fired = p.step, message
    run.attempt_loss_first_step, run.attempt_loss_min = rule.first_step, rule.low
    return fired


def _non_finite(b: Batch) -> Finding | None:
    for p in sorted(b.points, key=lambda p: p.step):
        if (bad := non_finite(p.name, p.value, p.step)) is not None:
            return bad[0], p.step, bad[1]
    return None


def _found(kind: str, hit: tuple[int, str] | None) -> Finding | None:
    return None if hit is None else (kind, *hit)


RULES: list[Rule] = [  # in the order their alerts are raised: the first stopping one names the stop
    Rule(("probe_failed",), stops=lambda r: True,
         find=lambda b: None if b.rules.probe is None else _found(
             "probe_failed", _probe_breach(b.session, b.run, b.points, b.rules.probe))),
    Rule(("loss_nan", "grad_norm_nan"), find=_non_finite,
         stops=lambda r: r.stop_on_nan, always=True),
    Rule(("loss_diverged",), stops=lambda r: r.stop_on_divergence, always=True,
         find=lambda b: _found("loss_diverged", _divergence(b.run, b.points, b.rules.divergence_factor))),
    Rule(("grad_norm_exploded",), stops=lambda r: r.stop_on_grad_norm,
         find=lambda b: _found("grad_norm_exploded", _grad_norm_spike(b.session, b.run.id, b.points,
                                                                      b.rules.grad_norm_factor))),
    Rule(("throughput_dropped",), stops=lambda r: r.stop_on_throughput,
         find=lambda b: _found("throughput_dropped", _throughput_drop(b.session, b.run.id, b.points,
                                                                      throughput_floor(b.run, b.rules)))),
    Rule(("stalled",), find=None, stops=lambda r: r.stop_on_stall),  # check_stalls
]
STALLED = next(rule for rule in RULES if rule.kinds == ("stalled",))


def earlier_attempts_file(run: Run, file_started: float | None) -> bool:
    """Whether a batch comes from a metrics file an earlier attempt began: its first step (`file_started`, the
    trainer's clock, as the shipper reads it) is older than the live attempt's start less the clock slack. A resumed
    attempt's shipper sends the earlier attempts' files again first; judged point by point, attempt 1's last steps
    written within that second of attempt 2's start passed as attempt 2's (a resume within a second, seen in the e2e
    divergence test: attempt 1's 1606.9 became attempt 2's divergence reference and 4826.3 fired at step 6). A file
    is begun at least a model load after its attempt started, and long before any later attempt starts."""
    if file_started is None or run.started_at is None:
        return False
    return file_started < transitions.as_utc(run.started_at).timestamp() - ATTEMPT_CLOCK_SLACK_S


def check(session: Session, run_id: int, points: list[PointIn], file_started: float | None = None) -> list[RunAlert]:
    """Alerts the batch raises (stored in the session, not committed); stops the run where the rule says so; none
    from a file an earlier attempt began (`earlier_attempts_file`). Also records what the run ran on (its device)
    from the trainer's `on_gpu` point, its latest loss, and when a step last arrived (the stall rule's clock)."""
    run = session.get(Run, run_id)
    if run is None or not points:
        return []
    rules = _rules(run)
    last = max((p for p in points if p.name == "loss" and p.rank == 0 and math.isfinite(p.value)),
               key=lambda p: p.step, default=None)
    if last is not None and (run.final_loss_step is None or last.step >= run.final_loss_step):
        run.final_loss, run.final_loss_step = last.value, last.step
    if any(p.name == "loss" for p in points):
        run.last_step_at = transitions.now()
    device = next((p.value for p in points if p.name == "on_gpu"), None)
    if device is not None and run.device is None:  # the trainer's "on_gpu" (1: CUDA, 0: CPU ranks)
        run.device = "cuda" if device else "cpu"
    if earlier_attempts_file(run, file_started):
        return []
    batch = Batch(session, run, this_attempts(run, points), rules)
    have = set(session.scalars(select(RunAlert.kind).where(RunAlert.run_id == run_id,
                                                           RunAlert.attempt == run.attempt)))
    found: list[tuple[str, int, str, bool]] = []
    for rule in RULES:
        if rule.find is None or (not rule.always and set(rule.kinds) <= have):
            continue
        if (finding := rule.find(batch)) is not None:
            found.append((*finding, rule.stops(rules)))
    return [_raise(session, run, have, *f) for f in found if f[0] not in have]


def _raise(session: Session, run: Run, have: set[str], kind: str, step: int, message: str, stop: bool) -> RunAlert:
    stopping = stop and RunState(run.state) in ACTIVE and not run.cancel_requested
    if stopping:
        transitions.request_stop(run, stop_reason(kind, message), by=kind)
    alert = RunAlert(run_id=run.id, attempt=run.attempt, kind=kind, step=step, message=message, stopped=stopping)
    session.add(alert)
    have.add(kind)
    return alert


def trainer_stopped(run_id: int, attempt: int, kind: str, step: int, message: str) -> bool:
    """The trainer of `attempt` stopped itself on rule `kind` (worker/trainer/stop_rules.py, the rules of
    plan/guardrails.py): record the alert it stopped on and the run's stop reason, as `check` does at ingest. The
    shipped metrics of that step raise the same alert there; whichever comes first writes the one row (per kind and
    attempt), and the other does nothing. Committed. False when the alert was there already or the attempt is no
    longer the run's live one."""
    if kind not in WHAT:
        return False
    with session_scope() as session:
        run = session.get(Run, run_id, with_for_update=True)
        if run is None or run.attempt != attempt:
            return False
        have = set(session.scalars(select(RunAlert.kind).where(RunAlert.run_id == run_id,
                                                               RunAlert.attempt == attempt)))
        if kind in have:
            return False
        _raise(session, run, have, kind, step, message, True)
        return True


def check_stalls(session: Session, at: datetime | None = None) -> list[RunAlert]:
    """Running runs with no step for their `run.stall_after_s`, counted from the later of the last step's arrival
    and the live attempt's start (a resumed attempt loads the model and its checkpoint first). Not committed."""
    at = at or transitions.now()
    raised = []
    stalled_already = select(RunAlert.run_id).where(RunAlert.kind == "stalled", RunAlert.attempt == Run.attempt)
    for run in session.scalars(select(Run).where(Run.state == RunState.RUNNING.value,
                                                 Run.id.not_in(stalled_already))):
        since = max((transitions.as_utc(t) for t in (run.started_at, run.last_step_at) if t is not None),
                    default=None)
        if since is None:
            continue
        rules, quiet_s = _rules(run), (at - since).total_seconds()
        if quiet_s > rules.stall_after_s:
            message = (f"no step for {quiet_s:.0f} s (run.stall_after_s = {rules.stall_after_s:g}); last step "
                       f"{run.last_step} of attempt {run.attempt}")
            raised.append(_raise(session, run, set(), "stalled", run.last_step, message, STALLED.stops(rules)))
    return raised
