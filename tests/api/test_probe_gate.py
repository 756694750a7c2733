"""The smoke-test gate (`run.probe`, backend/alerts/service.py): its first steps are checked at metric ingest and a
breach stops the run the way a stop_on_* alert does (cancel with a checkpoint, the reason in words)."""
from __future__ import annotations

import math

from tests.api.conftest import as_role
from tests.api.test_alerts import ingest, running_run
from tests.tiny import tiny_plan

GATE = {"steps": 3, "max_memory_fraction": 0.9, "min_tokens_per_s_fraction": 0.5}


def _step(step: int, loss: float = 5.0, tps: float | None = None, alloc: tuple[float, float] = (10.0, 10.0)):
    points = [{"step": step, "name": "loss", "value": loss}]
    points += [{"step": step, "rank": r, "name": "peak_allocated_gib", "value": v} for r, v in enumerate(alloc)]
    if tps is not None:
        points.append({"step": step, "name": "tokens_per_s", "value": tps})
    return {"points": points}


def _predicted(client, admin, run_id) -> float:
    return client.get(f"/api/runs/{run_id}", headers=admin).json()["estimate"]["throughput"]["tokens_per_s"]


def test_memory_over_the_fraction_stops_the_run_with_the_reason(client, tokens, tmp_path):
    from backend.runs import transitions
    from backend.runs.states import RunState

    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, probe=GATE)
    fast = _predicted(client, admin, run_id)
    ingest(client, admin, run_id, _step(1, tps=fast))
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["alerts"] == []
    ingest(client, admin, run_id, _step(2, tps=fast, alloc=(40.0, 76.2)))  # rank 1 of an 80 GiB H100
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["cancel_requested"] is True
    assert [(a["kind"], a["step"], a["stopped"]) for a in run["alerts"]] == [("probe_failed", 2, True)]
    assert run["alerts"][0]["message"] == "probe: rank 1 peaked at 76.2 GiB, 95% of 80 (limit 90%)"
    assert transitions.finish(run_id, 1, RunState.CANCELLED, "cancelled", last_step=2)
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["state"] == "stopped"  # a rule stopped it: neither cancelled nor succeeded
    assert run["exit_reason"] == "stopped: smoke test failed (probe: rank 1 peaked at 76.2 GiB, 95% of 80 (limit 90%))"
    events = client.get(f"/api/runs/{run_id}/events", headers=admin).json()
    assert any("probe: rank 1 peaked" in str(e) for e in events)


def test_slow_tokens_per_s_stop_at_the_last_checked_step(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, probe=GATE)
    predicted = _predicted(client, admin, run_id)
    ingest(client, admin, run_id, _step(1, tps=predicted * 0.01))  # the first step is not counted
    ingest(client, admin, run_id, _step(2, tps=predicted * 0.38))
    assert not client.get(f"/api/runs/{run_id}", headers=admin).json()["cancel_requested"]  # window not over
    ingest(client, admin, run_id, _step(3, tps=predicted * 0.38))
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["cancel_requested"]
    assert run["alerts"][0]["kind"] == "probe_failed"
    assert run["alerts"][0]["message"] == (f"probe: {predicted * 0.38:,.0f} tokens/s, 38% of the predicted "
                                           f"{predicted:,.0f} (limit 50%)")


def test_a_nan_loss_in_the_window_fails_the_probe(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, probe=GATE)
    ingest(client, admin, run_id, _step(1, loss=math.nan))
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["cancel_requested"]
    assert run["exit_reason"].startswith("stopped: smoke test failed (probe: loss is nan")


def test_a_passing_window_and_later_steps_raise_nothing(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = running_run(client, admin, tmp_path, probe=GATE)
    predicted = _predicted(client, admin, run_id)
    for s in range(1, 4):
        ingest(client, admin, run_id, _step(s, tps=predicted * 0.8))
    ingest(client, admin, run_id, _step(4, tps=predicted * 0.1, alloc=(79.0, 79.0)))  # after the window
    run = client.get(f"/api/runs/{run_id}", headers=admin).json()
    assert run["alerts"] == []
    assert not run["cancel_requested"]
    # without the section, the same memory stops nothing
    plain = running_run(client, admin, tmp_path)
    ingest(client, admin, plain, _step(1, alloc=(79.0, 79.0)))
    assert not client.get(f"/api/runs/{plain}", headers=admin).json()["cancel_requested"]


def test_the_gate_section_is_validated(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    plan_id = client.post("/api/plans", json={"name": "g", **tiny_plan()}, headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": "x"},
                                                                   "probe": {"max_memory_fraction": 1.5}}},
                    headers=admin)
    assert r.status_code == 422
    assert "run.probe.max_memory_fraction" in r.text
