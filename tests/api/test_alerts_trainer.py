"""The trainer's own stop (worker/trainer/stop_rules.py) recorded by its worker (`alerts.trainer_stopped`): the same
alert row the API raises from the shipped metrics, one whichever side comes first, and the run ends `stopped` with
it."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.api.test_alerts import alerts_of, ingest, loss_points, running_run

MESSAGE = "loss diverged: 3112 at step 3 is above 10 x this attempt's lowest loss so far 6.2"


def test_the_trainers_stop_first_then_the_shipped_step_raises_no_second_alert(client, tokens, tmp_path):
    from backend.alerts.service import trainer_stopped
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, learning_rate=10.0)
    ingest(client, admin, run_id, loss_points({1: 6.2, 2: 849.0}))  # step 3 never shipped (the API was away)
    assert trainer_stopped(run_id, 1, "loss_diverged", 3, MESSAGE)
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    assert not trainer_stopped(run_id, 1, "loss_diverged", 3, MESSAGE)  # a second report: nothing
    assert not trainer_stopped(run_id, 2, "loss_diverged", 3, MESSAGE)  # not the live attempt
    ingest(client, admin, run_id, loss_points({3: 3112.0}))  # shipped late: the same alert, no second row
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    assert transitions.finish(run_id, 1, RunState.STOPPED, "stopped: ...", last_step=3)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "stopped"
    assert run["exit_reason"] == f"stopped: loss diverged ({MESSAGE})"
    events = client.get(f"/api/runs/{run_id}/events", headers=admin).json()
    assert [(e["kind"], e.get("stopped")) for e in events if e["kind"] == "alert"] == [("alert", True)]
    assert events[-1]["state"] == "stopped"
    assert events[-1]["message"] == run["exit_reason"]


def test_the_api_first_then_the_trainers_report_adds_nothing(client, tokens, tmp_path):
    from backend.alerts.service import trainer_stopped

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, learning_rate=10.0)
    ingest(client, admin, run_id, loss_points({1: 6.2, 2: 849.0, 3: 3112.0}))
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert not trainer_stopped(run_id, 1, "loss_diverged", 3, MESSAGE)
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["exit_reason"] == run["exit_reason"]
    assert alerts_of(client, admin, run_id) == [("loss_diverged", 3, True)]
