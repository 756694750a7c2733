"""POST /api/plans/{id}/probe (backend/probes/service.py): bad input answers at once, naming the field; a plan whose
queue
no worker serves is refused, not queued to wait; a finished probe's result is stored with the plan and filed in the
calibration store (CPU ranks apart from the GPU type)."""
from __future__ import annotations

import json
import time

from plan.probe import summarize
from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def _plan_id(client, admin, layers: int = 8, gpu: str = "H100-80GB") -> int:
    p = tiny_plan()
    p["model"]["config"]["num_hidden_layers"] = layers
    p["hardware"]["gpu"] = gpu
    r = client.post("/api/plans", json={"name": "probe me", **p}, headers=admin)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_bad_probe_requests_name_the_field(client, tokens):
    admin = as_role(client, tokens, "admin")
    plan_id = _plan_id(client, admin, layers=4)
    r = client.post(f"/api/plans/{plan_id}/probe", json={"depths": [1, 2, 8]}, headers=admin)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "depths"
    assert "4 layers" in r.text
    r = client.post(f"/api/plans/{plan_id}/probe", json={"steps": 1}, headers=admin)
    assert r.status_code == 422
    assert "steps" in r.text
    r = client.post(f"/api/plans/{plan_id}/probe", json={"depth": [1]}, headers=admin)
    assert r.status_code == 422
    assert "depth" in r.text
    assert client.post("/api/plans/999999/probe", headers=admin).status_code == 404
    assert client.post(f"/api/plans/{plan_id}/probe", headers=as_role(client, tokens, "viewer")).status_code == 403


def test_a_stored_plan_that_no_longer_validates_is_a_422_naming_the_field(client, tokens):
    from backend.core.db import get_sessionmaker
    from backend.plans.models import Plan as PlanRow

    admin = as_role(client, tokens, "admin")
    plan_id = _plan_id(client, admin)
    with get_sessionmaker()() as s:  # e.g. written by an older version with other rules
        row = s.get(PlanRow, plan_id)
        row.spec = {**row.spec, "training": {**row.spec["training"], "zero_stage": 7}}
        s.commit()
    r = client.post(f"/api/plans/{plan_id}/probe", headers=admin)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "training.zero_stage"


def test_no_worker_on_the_queue_says_so_without_hanging(client, tokens):
    admin = as_role(client, tokens, "admin")
    # a GPU type no other test of the package has a running run of (a busy worker counts as a worker)
    plan_id = _plan_id(client, admin, gpu="B200-180GB")
    t0 = time.monotonic()
    r = client.post(f"/api/plans/{plan_id}/probe", headers=admin)  # the package's broker: nothing consumes it
    assert time.monotonic() - t0 < 10
    assert r.status_code == 409, r.text
    assert "no worker serves the queue gpu-b200-180gb" in r.json()["detail"][0]["message"]
    assert not [x for x in client.get("/api/runs", headers=admin).json() if x["plan_id"] == plan_id]


def test_a_worker_busy_training_counts_as_a_worker(client, tokens, tmp_path):
    """A worker (solo pool, one task at a time) cannot answer the broadcast while it trains a run of that GPU type:
    the probe is queued behind it, not refused."""
    from backend.runs import transitions
    from backend.runs.states import RunState
    from tests.api.test_alerts import running_run

    admin = as_role(client, tokens, "admin")
    busy = running_run(client, admin, tmp_path)  # an H100 run, claimed and started
    try:
        r = client.post(f"/api/plans/{_plan_id(client, admin)}/probe", headers=admin)
        assert r.status_code == 202, r.text
        assert r.json()["kind"] == "probe"
        assert r.json()["state"] == "queued"
    finally:
        transitions.finish(busy, 1, RunState.SUCCEEDED, None, last_step=0)


def test_a_finished_probe_is_stored_with_the_plan_and_calibration(client, tokens, tmp_path):
    from backend.core.db import get_sessionmaker
    from backend.probes.results import record_probe
    from backend.runs.models import Run

    admin = as_role(client, tokens, "admin")
    plan_id = _plan_id(client, admin)
    spec = client.get(f"/api/plans/{plan_id}", headers=admin).json()["plan"]
    measured = [{"depth": d, "status": "ok", "reason": None, "step_time_s": 0.1 * d, "tokens_per_s": 512 / d,
                 "loss_finite": True, "ranks": [{"rank": r, "peak_allocated_gib": 0.01 * d + 0.02,
                                                 "reserved_gib": None, "device_total_gib": None} for r in (0, 1)]}
                for d in (1, 2, 4)]
    (tmp_path / "probe.json").write_text(json.dumps(summarize(spec, measured, "cpu")))
    with get_sessionmaker()() as s:
        run = Run(name="probe", plan_id=plan_id, kind="probe", spec=spec, state="succeeded", run_dir=str(tmp_path))
        s.add(run)
        s.commit()
        result = record_probe(s, run)
        run_id = run.id
    assert result is not None
    assert result["run_id"] == run_id
    stored = client.get(f"/api/plans/{plan_id}", headers=admin).json()["probe"]
    assert stored["extrapolated"]["peak_allocated_gib"] == 0.1
    assert stored["run_id"] == run_id
    assert stored["verdict"]["text"].startswith("measured: fits with 80 GiB to spare")
    points = client.get("/api/calibration", headers=admin).json()["points"]
    mine = [p for p in points if p["source"] == "probe" and p["run_id"] == run_id]
    assert len(mine) == 1
    assert mine[0]["gpu"] == "cpu"  # CPU ranks never enter the H100's rows
    assert mine[0]["measured_peak_allocated_gib"] == 0.1
    assert mine[0]["predicted_tokens_per_s"] is None  # no CPU prediction, never the H100's
    # the probe run is labelled with what it ran on, not the plan's GPU
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["device"] == "cpu"


def test_an_approver_setting_requires_a_passing_probe_for_a_tight_plan(client, tokens, tmp_path, monkeypatch):
    from backend.core.db import get_sessionmaker
    from backend.core.settings import get_settings
    from backend.plans.models import Plan as PlanRow
    from backend.runs.models import Run

    admin = as_role(client, tokens, "admin")
    data = tmp_path / "d.txt"
    data.write_text("x " * 100)

    def pending_tight() -> int:
        plan_id = _plan_id(client, admin)
        run_id = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                             headers=admin).json()["id"]
        with get_sessionmaker()() as s:  # the planner's verdict (memory.verdict), where the planner states one
            run = s.get(Run, run_id)
            run.estimate = {**run.estimate, "memory": {**run.estimate["memory"], "verdict": "tight"}}
            s.commit()
        return run_id

    off = pending_tight()  # the setting is off by default: a tight plan is approved as any other
    assert client.post(f"/api/runs/{off}/approve", headers=admin).status_code == 200
    monkeypatch.setenv("ULAB_APPROVE_TIGHT_NEEDS_PROBE", "true")
    get_settings.cache_clear()
    try:
        run_id = pending_tight()
        r = client.post(f"/api/runs/{run_id}/approve", headers=admin)
        assert r.status_code == 409
        assert r.json()["detail"][0]["field"] == "probe"
        assert "it has not been probed" in r.text
        plan_id = client.get(f"/api/runs/{run_id}", headers=admin).json()["plan_id"]
        with get_sessionmaker()() as s:
            s.get(PlanRow, plan_id).probe = {"verdict": {"fits": False, "text": "measured: does not fit, 88 GiB of 80"}}
            s.commit()
        r = client.post(f"/api/runs/{run_id}/approve", headers=admin)
        assert r.status_code == 409
        assert "measured: does not fit, 88 GiB of 80" in r.text
        with get_sessionmaker()() as s:
            s.get(PlanRow, plan_id).probe = {"verdict": {"fits": True, "text": "measured: fits with 11 GiB to spare"}}
            s.commit()
        assert client.post(f"/api/runs/{run_id}/approve", headers=admin).status_code == 200
    finally:
        monkeypatch.delenv("ULAB_APPROVE_TIGHT_NEEDS_PROBE")
        get_settings.cache_clear()


def test_a_probe_is_queued_as_a_run_of_kind_probe(client, tokens, tmp_path, monkeypatch):
    """On the embedded SQLite broker (no broadcast: nobody can tell whether a worker listens) the probe is queued."""
    from backend.core.settings import get_settings

    submitter = as_role(client, tokens, "submitter")
    plan_id = _plan_id(client, submitter, layers=3)  # the submitter's own plan, whose estimate fits
    monkeypatch.setenv("ULAB_BROKER_URL", f"sqla+sqlite:///{tmp_path / 'broker.db'}")
    get_settings.cache_clear()
    try:
        r = client.post(f"/api/plans/{plan_id}/probe", headers=submitter)
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
    assert r.status_code == 202, r.text
    run = r.json()
    assert (run["kind"], run["state"], run["plan_id"], run["steps"]) == ("probe", "queued", plan_id, 0)
    assert run["approved_by"] is not None
    assert "run" not in run["spec"]
    from backend.core.db import get_sessionmaker
    from backend.runs.models import Run

    with get_sessionmaker()() as s:
        assert s.get(Run, run["id"]).probe_request == {"depths": [1, 2], "steps": 4}  # 4 is past the 3 layers
