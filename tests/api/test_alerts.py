"""Alerts at metric ingest (backend/alerts/service.py): a NaN loss stops a running run with its reason, a
diverging loss (the issue's lr=10 run: 6.2 -> 5000) raises one alert, shown on the run and in the runs list."""
from __future__ import annotations

import json
import math

from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def running_run(client, admin, tmp_path, **run) -> int:
    from backend.runs import transitions

    data = tmp_path / "d.txt"
    data.write_text("x " * 100)
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}, **run}},
                    headers=admin)
    run_id = r.json()["id"]
    assert client.post(f"/api/runs/{run_id}/approve", headers=admin).status_code == 200
    assert transitions.claim(run_id, "test-worker") is not None
    assert transitions.start(run_id, 1, str(tmp_path))
    return run_id


def loss_points(values: dict[int, float]) -> dict:
    return {"points": [{"step": s, "name": "loss", "value": v} for s, v in values.items()]}


def ingest(client, admin, run_id, body) -> None:
    # as the worker's shipper sends it: json.dumps writes NaN (httpx's json= refuses it)
    r = client.post(f"/api/runs/{run_id}/metrics", content=json.dumps(body),
                    headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def test_a_nan_loss_stops_the_run_with_the_reason(client, tokens, tmp_path):
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    ingest(client, admin, run_id, {"points": [{"step": 1, "name": "loss", "value": 6.2},
                                              {"step": 2, "name": "loss", "value": math.nan}]})
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["cancel_requested"] is True
    assert [(a["kind"], a["step"], a["stopped"]) for a in run["alerts"]] == [("loss_nan", 2, True)]
    # the worker stops the trainer and records the cancel; the reason stays the rule's
    assert transitions.finish(run_id, 1, RunState.CANCELLED, "cancelled", last_step=2)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    # a rule's stop ends in its own state, neither cancelled nor succeeded
    assert run["state"] == "stopped"
    assert run["exit_reason"].startswith("stopped: loss is NaN/Inf")
    steps = client.get(f"/api/runs/{run_id}/metrics", params={"name": "loss"}, headers=admin).json()
    assert steps["series"][0]["step"] == [1]  # the NaN itself is not stored


def test_divergence_fires_from_the_third_step_against_the_running_minimum(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    warned = running_run(client, admin, tmp_path, stop_on_divergence=False)
    ingest(client, admin, warned, loss_points({1: 6.2, 2: 80.0}))  # step 2: too early, whatever its size
    assert alerts_of(client, admin, warned) == []
    ingest(client, admin, warned, loss_points({3: 5.0, 4: 40.0}))  # 40 < 10 x 5 (the running minimum)
    assert alerts_of(client, admin, warned) == []
    ingest(client, admin, warned, loss_points({5: 51.0}))
    ingest(client, admin, warned, loss_points({6: 6000.0}))  # one alert per kind and attempt
    run = client.get(f"/api/runs/{warned}", headers=admin).json()
    assert alerts_of(client, admin, warned) == [("loss_diverged", 5, False)]
    assert not run["cancel_requested"]
    assert "above 10 x this attempt's lowest loss so far 5" in run["alerts"][0]["message"]
    listed = {r["id"]: r for r in client.get("/api/runs", headers=admin).json()}
    assert [a["kind"] for a in listed[warned]["alerts"]] == ["loss_diverged"]


def test_the_issues_lr_10_run_is_stopped_at_step_3_and_the_rules_re_arm_on_resume(client, tokens, tmp_path):
    """On by default; the run ends `stopped`; a resume at a lower learning rate from the diverged checkpoint is
    measured against its own steps (it trains on), and a resume that diverges again is stopped again."""
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, learning_rate=10.0)
    ingest(client, admin, run_id, loss_points({1: 6.2, 2: 849.0, 3: 3112.0}))
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    assert transitions.finish(run_id, 1, RunState.CANCELLED, "cancelled by request", last_step=3)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "stopped"
    assert run["exit_reason"].startswith("stopped: loss diverged (loss diverged: 3112")

    r = client.post(f"/api/runs/{run_id}/retry", json={"learning_rate": 1e-3, "lr_scheduler": "cosine"},
                    headers=admin)
    assert r.status_code == 200, r.text
    assert (r.json()["spec"]["run"]["learning_rate"], r.json()["spec"]["run"]["lr_scheduler"]) == (1e-3, "cosine")
    assert transitions.claim(run_id, "test-worker") is not None
    assert transitions.start(run_id, 2, str(tmp_path))
    # the new attempt's shipper sends attempt 1's file again first: written before attempt 2 started, it raises nothing
    ingest(client, admin, run_id, {"points": [{"step": s, "name": "loss", "value": v, "wall_time": 1.7e9}
                                              for s, v in {1: 6.2, 2: 849.0, 3: 3112.0}.items()]})
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    ingest(client, admin, run_id, loss_points({4: 3000.0, 5: 2900.0, 6: 2500.0, 7: 2000.0}))  # trains on
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    ingest(client, admin, run_id, loss_points({8: 30_000.0}))  # diverges again: stopped again
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert [(a["attempt"], a["step"], a["stopped"]) for a in run["alerts"]] == [(1, 3, True), (2, 8, True)]
    assert run["cancel_requested"]
    events = client.get(f"/api/runs/{run_id}/events", headers=admin).json()
    changed = next(e for e in events if e["kind"] == "changed")
    assert changed["attempt"] == 2, changed
    assert changed["message"] == ("resumed with learning_rate 10.0 -> 0.001, "
                                  "lr_scheduler constant -> cosine"), changed
    r = client.post(f"/api/runs/{run_id}/retry", json={"learning_rate": 11}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "learning_rate", r.text


def test_a_resume_within_a_second_takes_no_divergence_reference_from_the_attempt_before(client, tokens, tmp_path):
    """Attempt 2 starts within the clock slack of attempt 1's last step, and its shipper sends attempt 1's file again
    before its own exists: those last points pass the wall-time filter, but their file was begun long before attempt
    2 started, so attempt 2 is held to its own losses only (the e2e divergence test's flake: attempt 1's 1606.9
    became the reference and 4826.3 fired at step 6)."""
    import time

    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, divergence_factor=3.0)
    began = time.time() - 60  # attempt 1's file: its first step a minute ago
    first = {1: (6.24, began), 2: (1606.9, time.time() - 0.6), 3: (3001.8, time.time() - 0.5)}
    resent = [{"step": s, "name": "loss", "value": v, "wall_time": t} for s, (v, t) in first.items()]
    ingest(client, admin, run_id, {"points": resent, "first_step": 1, "file_started": began})
    assert transitions.finish(run_id, 1, RunState.FAILED, "error: killed", last_step=3)
    assert client.post(f"/api/runs/{run_id}/retry", headers=admin).status_code == 200
    assert transitions.claim(run_id, "test-worker") is not None
    assert transitions.start(run_id, 2, str(tmp_path))
    ingest(client, admin, run_id, {"points": resent, "first_step": 1, "file_started": began})  # sent again first
    mine = time.time()
    ingest(client, admin, run_id, {**loss_points({4: 2134.9, 5: 3835.7, 6: 4826.3}), "first_step": 4,
                                   "file_started": mine})
    assert attempt_alerts(client, admin, run_id, 2) == [], "4826.3 < 3 x 2134.9"
    ingest(client, admin, run_id, {"points": resent, "first_step": 1, "file_started": began})  # again: nothing
    ingest(client, admin, run_id, {**loss_points({7: 6500.0}), "first_step": 4, "file_started": mine})
    assert attempt_alerts(client, admin, run_id, 2) == [("loss_diverged", 7)]  # its own divergence fires


def attempt_alerts(client, admin, run_id, attempt: int) -> list[tuple]:
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    return [(a["kind"], a["step"]) for a in run["alerts"] if a["attempt"] == attempt]


def test_a_healthy_loss_raises_nothing(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    ingest(client, admin, run_id, loss_points({s: 6.0 / s ** 0.3 for s in range(1, 40)}))
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["alerts"] == []


def points(name: str, values: dict[int, float]) -> dict:
    return {"points": [{"step": s, "name": name, "value": v} for s, v in values.items()]}


def alerts_of(client, admin, run_id) -> list[tuple]:
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    return [(a["kind"], a["step"], a["stopped"]) for a in run["alerts"]]


def test_a_grad_norm_spike_raises_one_alert_and_a_falling_grad_norm_none(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    healthy = running_run(client, admin, tmp_path)
    # large early grad norms that fall (a normal start), with step-to-step noise of +-30%
    ingest(client, admin, healthy, points("grad_norm", {s: 8.0 / s ** 0.5 * (1.3 if s % 2 else 0.7)
                                                        for s in range(1, 120)}))
    assert alerts_of(client, admin, healthy) == []

    spiked = running_run(client, admin, tmp_path)
    ingest(client, admin, spiked, points("grad_norm", {s: 1.0 + 0.1 * (s % 3) for s in range(1, 21)}))
    ingest(client, admin, spiked, points("grad_norm", {21: 9.0, 22: 40.0, 23: 1.0}))  # 9 < 10 x 1.1; 40 is not
    ingest(client, admin, spiked, points("grad_norm", {24: 80.0}))  # one alert per kind
    assert alerts_of(client, admin, spiked) == [("grad_norm_exploded", 22, False)]
    message = client.get(f"/api/runs/{spiked}", headers=admin).json()["alerts"][0]["message"]
    assert "above 10 x its median 1.1 over the previous 21 steps" in message, message

    stopped = running_run(client, admin, tmp_path, stop_on_grad_norm=True, grad_norm_factor=3)
    ingest(client, admin, stopped, points("grad_norm", {s: 1.0 for s in range(1, 11)} | {11: 3.5}))
    run = client.get(f"/api/runs/{stopped}", headers=admin).json()
    assert run["cancel_requested"]
    assert run["exit_reason"].startswith("stopped: grad norm exploded (")
    assert alerts_of(client, admin, stopped) == [("grad_norm_exploded", 11, True)]


def test_tokens_per_s_below_the_floor_for_five_steps_in_a_row_raises_an_alert(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, stop_on_throughput=True)
    steady = {s: 1000.0 + 10 * (s % 4) for s in range(1, 21)}
    ingest(client, admin, run_id, points("tokens_per_s", steady | {1: 80.0}))  # a slow first step
    # four slow steps (a checkpoint save, a neighbour's job), then back: nothing
    ingest(client, admin, run_id, points("tokens_per_s", {21: 300.0, 22: 300.0, 23: 300.0, 24: 300.0, 25: 990.0}))
    assert alerts_of(client, admin, run_id) == []
    # five in a row, sent one at a time as the shipper does: the fifth raises it, and stops the run as asked
    for step in range(26, 31):
        ingest(client, admin, run_id, points("tokens_per_s", {step: 420.0}))
        assert alerts_of(client, admin, run_id) == ([("throughput_dropped", 30, True)] if step == 30 else [])
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["exit_reason"].startswith("stopped: tokens/s dropped (tokens/s dropped: 420 at step 30"), run


def test_on_cpu_ranks_jitter_as_deep_as_measured_raises_nothing_and_a_deeper_drop_still_does(client, tokens,
                                                                                             tmp_path):
    """bench/cpu_step_jitter.py: a healthy tiny CPU run's best tokens/s over 5 steps in a row fell to 0.21 x its
    median; on CPU ranks the rule's floor is CPU_JITTER_FLOOR (0.1), so that raises nothing, while a GPU run's
    (the plan's 0.5) would."""
    from backend.alerts.service import CPU_JITTER_FLOOR

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, stop_on_throughput=True)
    ingest(client, admin, run_id, points("on_gpu", {1: 0.0}))  # what the trainer reports from CPU ranks
    ingest(client, admin, run_id, points("tokens_per_s", {s: 1000.0 + 10 * (s % 4) for s in range(1, 21)}))
    ingest(client, admin, run_id, points("tokens_per_s", dict.fromkeys(range(21, 26), 210.0) | {26: 1000.0}))
    assert alerts_of(client, admin, run_id) == []
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["device"] == "cpu"
    deeper = 0.5 * CPU_JITTER_FLOOR * 1000.0
    ingest(client, admin, run_id, points("tokens_per_s", dict.fromkeys(range(27, 32), deeper)))
    assert alerts_of(client, admin, run_id) == [("throughput_dropped", 31, True)]


def test_a_running_run_with_no_step_for_stall_after_s_raises_stalled(client, tokens, tmp_path):
    from datetime import timedelta

    from backend.alerts.service import check_stalls
    from backend.core.db import session_scope
    from backend.runs import transitions
    from backend.runs.models import Run

    admin = as_role(client, tokens, "admin")
    warned = running_run(client, admin, tmp_path, stall_after_s=60)
    stopped = running_run(client, admin, tmp_path, stall_after_s=60, stop_on_stall=True)
    ingest(client, admin, warned, loss_points({1: 6.0}))
    ingest(client, admin, stopped, loss_points({1: 6.0}))
    at = transitions.now()
    with session_scope() as s:  # other runs of this module may stall too; these two must not, yet
        assert {warned, stopped}.isdisjoint(a.run_id for a in check_stalls(s, at + timedelta(seconds=50)))
    with session_scope() as s:  # the stopped run started and last stepped 100 s ago, the warned run just now
        row = s.get_one(Run, stopped)
        row.started_at = row.last_step_at = at - timedelta(seconds=100)
    with session_scope() as s:
        raised = {a.run_id for a in check_stalls(s, at + timedelta(seconds=1))}
    assert stopped in raised
    assert warned not in raised
    with session_scope() as s:
        raised = {a.run_id for a in check_stalls(s, at + timedelta(seconds=200))}
    assert warned in raised
    assert stopped not in raised  # one alert per run
    assert alerts_of(client, admin, warned)[0][::2] == ("stalled", False)
    run = client.get(f"/api/runs/{stopped}", headers=admin).json()
    assert run["cancel_requested"]
    assert run["alerts"][0]["kind"] == "stalled"
    assert run["alerts"][0]["message"].startswith("no step for "), run["alerts"]
    assert "(run.stall_after_s = 60)" in run["alerts"][0]["message"]


def test_a_run_that_ends_with_an_alert_that_stopped_nothing_shows_it_beside_its_state(client, tokens, tmp_path):
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, stop_on_divergence=False, steps=3)
    ingest(client, admin, run_id, loss_points({1: 6.2, 2: 1152.0, 3: 3924.0}))
    assert transitions.finish(run_id, 1, RunState.SUCCEEDED, None, last_step=3)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "succeeded"
    assert [(a["kind"], a["step"], a["stopped"]) for a in run["open_alerts"]] == [("loss_diverged", 3, False)]
    listed = {r["id"]: r for r in client.get("/api/runs", headers=admin).json()}
    assert [a["kind"] for a in listed[run_id]["open_alerts"]] == ["loss_diverged"]
    (tmp_path / "healthy").mkdir()
    healthy = running_run(client, admin, tmp_path / "healthy", steps=3)
    ingest(client, admin, healthy, loss_points({1: 6.2, 2: 5.9, 3: 5.5}))
    assert transitions.finish(healthy, 1, RunState.SUCCEEDED, None, last_step=3)
    assert client.get(f"/api/runs/{healthy}", headers=admin).json()["open_alerts"] == []
