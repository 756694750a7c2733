"""Runs a person can work with: tags and notes (PATCH /api/runs/{id}), the runs list filtered by tag, and the final
loss kept at metric ingest."""
from __future__ import annotations

from tests.api.conftest import as_role
from tests.tiny import tiny_plan


def make_run(client, headers, tmp_path) -> int:
    data = tmp_path / "d.txt"
    data.write_text("x " * 100)
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=headers).json()["id"]
    return client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                       headers=headers).json()["id"]


def test_tags_notes_and_the_tag_filter(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    tagged, other = make_run(client, admin, tmp_path), make_run(client, admin, tmp_path)
    r = client.patch(f"/api/runs/{tagged}", json={"tags": ["baseline", "64k", "baseline"], "notes": "lr sweep 1/3"},
                     headers=admin)
    assert r.status_code == 200, r.text
    assert (r.json()["tags"], r.json()["notes"]) == (["64k", "baseline"], "lr sweep 1/3")
    r = client.patch(f"/api/runs/{tagged}", json={"notes": "kept tags"}, headers=admin)
    assert r.json()["tags"] == ["64k", "baseline"]
    ids = [x["id"] for x in client.get("/api/runs", params={"tag": "baseline"}, headers=admin).json()]
    assert tagged in ids
    assert other not in ids
    bad = client.patch(f"/api/runs/{tagged}", json={"tags": ["x" * 41]}, headers=admin)
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["field"].startswith("tags")
    viewer = as_role(client, tokens, "viewer")
    assert client.patch(f"/api/runs/{tagged}", json={"notes": "no"}, headers=viewer).status_code == 403


def test_the_final_loss_is_the_loss_at_the_highest_step(client, tokens, tmp_path):
    admin = as_role(client, tokens, "admin")
    run_id = make_run(client, admin, tmp_path)
    url = f"/api/runs/{run_id}/metrics"
    for batch in ({5: 2.5, 4: 3.0}, {3: 9.0}):  # a late, lower step does not replace the final loss
        points = [{"step": step, "name": "loss", "value": v} for step, v in batch.items()]
        assert client.post(url, json={"points": points}, headers=admin).status_code == 200
    assert client.get(f"/api/runs/{run_id}", headers=admin).json()["final_loss"] == 2.5
