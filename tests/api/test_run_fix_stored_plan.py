"""GET /api/runs/{id}/fix reads the run's validated plan (`Run.plan`); a stored plan that the current plan model
refuses (a row written by an older version) gets the planner's answer naming the field, not a 500."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def test_the_fix_of_a_run_whose_stored_plan_no_longer_validates_names_the_field(client, tokens, tmp_path):
    from backend.core.db import session_scope
    from backend.runs.models import Run

    admin = as_role(client, tokens, "admin")
    data = tmp_path / "d.txt"
    data.write_text("x " * 100)
    plan_id = client.post("/api/plans", json={"name": "fix-stored", **tiny_plan()}, headers=admin).json()["id"]
    r = client.post("/api/runs", json={"plan_id": plan_id, "name": "fix-stored",
                                       "run": {"steps": 2, "data": {"path": str(data)}}}, headers=admin)
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    good = client.get(f"/api/runs/{run_id}/fix", headers=admin)
    assert good.status_code == 200, good.text
    with session_scope() as s:
        run = s.get(Run, run_id)
        assert run is not None
        spec = dict(run.spec)
        spec["training"] = {**spec["training"], "zero_stage": 7}  # outside the model's range
        run.spec = spec
    bad = client.get(f"/api/runs/{run_id}/fix", headers=admin)
    assert bad.status_code == 200, bad.text
    assert "training.zero_stage" in bad.text, bad.text
