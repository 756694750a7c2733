"""The planner's Submit sends the plan with its run: the plan is stored only when the run is created, so a
refused submit leaves no plan behind; a typed "abc" learning rate is named as not a number."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def test_a_refused_submit_stores_no_plan_and_an_accepted_one_stores_its_plan(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    data = tmp_path / "d.txt"
    data.write_text("the quick brown fox. " * 200)
    before = len(client.get("/api/plans", headers=admin).json())
    r = client.post("/api/runs", json={"plan": tiny_plan(), "name": "bad-lr",
                                       "run": {"learning_rate": "abc", "data": {"path": str(data)}}}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "run.learning_rate", r.text
    assert "number" in r.json()["detail"][0]["message"]
    assert "None" not in r.json()["detail"][0]["message"]
    r = client.post("/api/runs", json={"plan": tiny_plan(), "run": {"data": {"path": "/etc/hostname"},
                                                                    "steps": 2}}, headers=admin)
    assert r.json()["detail"][0]["field"] == "run.data.path", r.text  # refused after the plan was stored in the session
    assert len(client.get("/api/plans", headers=admin).json()) == before
    r = client.post("/api/runs", json={"plan": tiny_plan(), "name": "ok", "run": {"data": {"path": str(data)}}},
                    headers=admin)
    assert r.status_code == 201, r.text
    plans = client.get("/api/plans", headers=admin).json()
    assert len(plans) == before + 1
    assert plans[0]["id"] == r.json()["plan_id"]
    assert plans[0]["name"] == "ok"


def test_exactly_one_of_plan_id_and_plan(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    r = client.post("/api/runs", json={"run": {"data": {"path": "x"}}}, headers=admin)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "plan_id", r.text
