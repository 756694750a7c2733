"""Alerts at metric ingest (backend/metrics/alerts.py): a NaN loss stops a running run with its reason, a
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
    assert run["state"] == "cancelled" and run["exit_reason"].startswith("stopped: loss is NaN/Inf")
    steps = client.get(f"/api/runs/{run_id}/metrics", params={"name": "loss"}, headers=admin).json()
    assert steps["series"][0]["step"] == [1]  # the NaN itself is not stored


def test_a_diverging_loss_raises_one_alert_and_stops_only_when_asked(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    warned = running_run(client, admin, tmp_path)
    ingest(client, admin, warned, loss_points({s: 6.2 - 0.05 * s for s in range(1, 11)}))
    ingest(client, admin, warned, loss_points({11: 40.0, 12: 5000.0}))
    ingest(client, admin, warned, loss_points({13: 6000.0}))
    run = client.get(f"/api/runs/{warned}", headers=admin).json()
    assert [(a["kind"], a["step"], a["stopped"]) for a in run["alerts"]] == [("loss_diverged", 12, False)]
    assert "above 10 x its early minimum" in run["alerts"][0]["message"] and not run["cancel_requested"]
    listed = {r["id"]: r for r in client.get("/api/runs", headers=admin).json()}
    assert [a["kind"] for a in listed[warned]["alerts"]] == ["loss_diverged"]

    stopped = running_run(client, admin, tmp_path, stop_on_divergence=True, divergence_factor=5)
    ingest(client, admin, stopped, loss_points({1: 6.2, 11: 40.0}))
    run = client.get(f"/api/runs/{stopped}", headers=admin).json()
    assert run["cancel_requested"] and run["alerts"][0]["stopped"]


def test_a_healthy_loss_raises_nothing(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path)
    ingest(client, admin, run_id, loss_points({s: 6.0 / s ** 0.3 for s in range(1, 40)}))
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["alerts"] == []
