"""One verdict for one plan: the import panel (POST /api/plans/import), the planner (POST /api/estimate), Recommend,
a stored plan, the run page (GET /api/runs/{id}) and `ulab plan --text` state the same verdict in the same words,
those of plan/verdict.py. The plan is a pasted Accelerate setup at a length whose memory band straddles the card
(a point estimate that fits, a band whose high end does not): the case that read "does not fit" in one place and
"may not fit" in another."""
from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from backend.cli import app as ulab
from plan import max_seq_len
from plan.verdict import verdict_text
from tests.api.conftest import as_role

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "imports"


def _import(client, headers, seq_len: int) -> dict:
    launch = (FIXTURES / "accelerate_sp_launch.txt").read_text().replace("131072", str(seq_len))
    r = client.post("/api/plans/import", json={"accelerate_config": (FIXTURES / "accelerate_sp.yaml").read_text(),
                                               "launch": launch}, headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def _save_preset_config(app_env, preset: str) -> None:
    """The preset's config.json under the models root: what a run of it needs to be submitted (no weights)."""
    from plan import catalog

    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "vocab_size", "tie_word_embeddings", "max_position_embeddings")
    config = {k: v for k, v in catalog.models()[preset].as_dict().items() if k in keys}
    path = Path(app_env["ULAB_HOME"]) / "models" / preset / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))


def test_every_reader_states_the_same_verdict(client, tokens, tmp_path, app_env):
    admin = as_role(client, tokens, "admin")
    _save_preset_config(app_env, "Qwen/Qwen3-8B")
    plan = _import(client, admin, 131072)["plan"]
    imported = _import(client, admin, max_seq_len(plan)["likely"])        # the point fits; the band's top does not
    plan, memory = imported["plan"], imported["estimate"]["memory"]
    assert memory["verdict"] == "tight", memory
    lo, hi = memory["device_total_gib_range"]
    words = verdict_text(lo, hi, memory["gpu_capacity_gib"])
    assert words.startswith("may not fit: "), words
    assert words.endswith(" GiB of 80"), words
    said = {"import": (memory["verdict_label"], memory["verdict_text"])}

    m = client.post("/api/estimate", json=plan, headers=admin).json()["memory"]
    said["planner"] = (m["verdict_label"], m["verdict_text"])

    recs = client.post("/api/estimate/recommend", json={"plan": plan}, headers=admin).json()["recommendations"]
    assert recs, recs
    assert recs[0]["plan"] == plan, recs              # every field set: the plan itself
    said["recommend"] = (recs[0]["estimate"]["memory"]["verdict_label"], recs[0]["estimate"]["memory"]["verdict_text"])

    stored = client.post("/api/plans", json=plan, headers=admin).json()
    said["stored plan"] = (stored["estimate"]["memory"]["verdict_label"], stored["estimate"]["memory"]["verdict_text"])
    data = tmp_path / "d.txt"
    data.write_text("x " * 100)
    run = client.post("/api/runs", json={"plan_id": stored["id"], "run": {"data": {"path": str(data)}}}, headers=admin)
    assert run.status_code == 201, run.text
    rm = client.get(f"/api/runs/{run.json()['id']}", headers=admin).json()["estimate"]["memory"]
    said["run page"] = (rm["verdict_label"], rm["verdict_text"])

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    text = CliRunner().invoke(ulab, ["plan", "--json", str(plan_file), "--text"]).output
    rec_text = CliRunner().invoke(ulab, ["plan", "--json", str(plan_file), "--recommend", "--text"]).output
    assert f"  {words} (range" in text, text
    assert f"   {words}; " in rec_text, rec_text
    assert set(said.values()) == {("may not fit", words)}, said
