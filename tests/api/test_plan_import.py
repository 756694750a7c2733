"""POST /api/plans/import: the pasted setup comes back as a plan with its warnings, errors and estimate; text that
does not parse is a 422 naming its line."""
from __future__ import annotations

from pathlib import Path

from tests.api.conftest import as_role

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "imports"


def test_the_guide_setup_pasted(client, tokens):
    body = {"ds_config": (FIXTURES / "guide_ds_config.json").read_text(),
            "launch": (FIXTURES / "guide_launch.txt").read_text()}
    r = client.post("/api/plans/import", json=body, headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [e["field"] for e in out["errors"]] == ["--num_gpus"]
    assert "sequence_parallelism" in [w["field"] for w in out["warnings"]]
    assert out["plan"]["training"]["seq_len"] == 524288
    assert out["estimate"]["valid"]


def test_malformed_text_is_a_422_naming_the_line(client, tokens):
    viewer = as_role(client, tokens, "viewer")
    r = client.post("/api/plans/import", json={"ds_config": '{\n "fp16": {"enabled": true},\n}'}, headers=viewer)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "ds_config"
    assert "line 3" in r.json()["detail"][0]["message"]
    r = client.post("/api/plans/import", json={"accelerate_config": "a: 1\nb: [\n"}, headers=viewer)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "accelerate_config"
    r = client.post("/api/plans/import", json={"launch": "srun x.py"}, headers=viewer)
    assert r.status_code == 422
    assert r.json()["detail"][0]["field"] == "launch"
    assert client.post("/api/plans/import", json={}, headers=viewer).status_code == 422


def test_plan_defaults_answer_with_the_tracker_fields(client, tokens):
    """run.report_to's default is a list: GET /api/plans/defaults answers it (a default_factory made it a 500)."""
    r = client.get("/api/plans/defaults", headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 200, r.text
    assert r.json()["defaults"]["run"]["report_to"] == []
    assert r.json()["choices"]["run.report_to"] == ["mlflow", "wandb", "tensorboard"]
