"""The NaN and divergence rules, defined once (plan/guardrails.py), as the trainer's guard applies them
(worker/trainer/stop_rules.py): the same step, kind and message as the API's alerts (tests/api/test_alerts.py)."""
from __future__ import annotations

import math
from types import SimpleNamespace

from plan.guardrails import DIVERGENCE_FROM, Divergence, non_finite, stop_reason
from worker.trainer.stop_rules import Guard, read_stopped


def rules(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"stop_on_nan": True, "stop_on_divergence": True, "divergence_factor": 10.0, **kw})


def test_divergence_fires_from_the_third_step_against_the_running_minimum():
    rule = Divergence(10.0)
    assert [rule.observe(s, v) for s, v in [(1, 6.2), (2, 80.0), (3, 5.0), (4, 40.0)]] == [None] * 4
    assert rule.observe(5, 51.0) == "loss diverged: 51 at step 5 is above 10 x this attempt's lowest loss so far 5"
    assert (rule.first_step, rule.low) == (1, 5.0)
    resumed = Divergence(10.0)  # an attempt that starts at step 11: its own third step
    assert resumed.observe(11, 6.0) is None
    assert resumed.observe(12, 600.0) is None
    assert resumed.observe(10 + DIVERGENCE_FROM, 61.0) is not None
    assert Divergence(10.0).observe(1, math.nan) is None


def test_non_finite_names_the_figure():
    assert non_finite("loss", math.nan, 4) == ("loss_nan", "loss is nan at step 4")
    assert non_finite("grad_norm", math.inf, 2) == ("grad_norm_nan", "grad_norm is inf at step 2")
    assert non_finite("loss", 1.0, 2) is None
    assert non_finite("lr", math.nan, 2) is None
    assert stop_reason("loss_nan", "loss is nan at step 4") == "stopped: loss is NaN/Inf (loss is nan at step 4)"


def test_the_guard_stops_on_the_issues_lr_10_losses_at_step_3():
    guard = Guard(rules())
    assert guard.observe(1, 6.2, 1.0) is None
    assert guard.observe(2, 849.0, 50.0) is None
    kind, step, message = guard.observe(3, 3112.0, 90.0)
    assert (kind, step) == ("loss_diverged", 3)
    assert guard.reason == f"stopped: loss diverged ({message})"


def test_the_guard_stops_on_a_nan_grad_norm_and_only_where_its_switch_is_on(tmp_path):
    guard = Guard(rules())
    assert guard.observe(1, 6.2, math.nan) == ("grad_norm_nan", 1, "grad_norm is nan at step 1")
    guard.write(tmp_path, attempt=2)
    assert read_stopped(tmp_path, 2)["reason"] == guard.reason
    assert read_stopped(tmp_path, 1) is None
    off = Guard(rules(stop_on_nan=False, stop_on_divergence=False))
    assert [off.observe(s, v, None) for s, v in [(1, 6.2), (2, math.nan), (3, 6000.0)]] == [None] * 3
    assert off.reason is None


def test_a_resumed_rule_starts_from_the_inherited_reference_and_says_so():
    rule = Divergence(3.0, inherited=6.2)
    assert [rule.observe(s, v) for s, v in [(4, 4568.0), (5, 4540.0)]] == [None, None]  # its first two steps
    assert not rule.within
    assert rule.observe(6, 4501.0) == ("loss diverged: 4501 at step 6 is above 3 x the run's lowest loss up to the "
                                       "checkpoint this attempt resumed from 6.2")
    back = Divergence(3.0, inherited=6.2)  # a loss that comes back within the factor trains on
    assert [back.observe(s, v) for s, v in [(4, 40.0), (5, 12.0), (6, 8.0), (7, 6.0)]] == [None] * 4
    assert back.within
    assert back.low == 6.0


def test_a_checkpoints_record_round_trips(tmp_path):
    from plan.guardrails import GUARD_FILE, guard_record, read_guard_record

    rule = Divergence(3.0)
    for s, v in [(1, 6.2), (2, 1152.4)]:
        rule.observe(s, v)
    (tmp_path / GUARD_FILE).write_text(guard_record(2, 1152.4, rule))
    assert read_guard_record(tmp_path) == {"step": 2, "loss": 1152.4, "low": 6.2, "within": False}
    (tmp_path / GUARD_FILE).write_text("not json")
    assert read_guard_record(tmp_path) is None
    assert read_guard_record(tmp_path / "missing") is None
