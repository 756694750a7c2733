"""An unnamed run from an unnamed plan is called by its model, layout and context (it was "plan 9"), the
name the runs list and the run page show."""
from __future__ import annotations

import json
from pathlib import Path

from plan.report import default_run_name
from tests.api.conftest import as_role
from tests.tiny import tiny_plan

PRESET_8B = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
             "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4},
             "parallel": {"sp_size": 8, "dp_size": 4}, "training": {"seq_len": 131072}}


def test_the_name_says_model_layout_and_context():
    assert default_run_name(PRESET_8B) == "llama-3.1-8b sp8 dp4 4 nodes 128K"
    one_node = json.loads(json.dumps(PRESET_8B))
    one_node["hardware"]["num_nodes"], one_node["parallel"]["dp_size"] = 1, 1
    assert default_run_name(one_node) == "llama-3.1-8b sp8 128K"
    assert default_run_name(tiny_plan()) == "llama-140K sp2 512"  # a config: its type and parameter count
    assert default_run_name(tiny_plan(seq_len=1 << 20)) == "llama-140K sp2 1M"


def test_an_unnamed_run_gets_it_and_a_named_one_keeps_its_name(client, tokens, tmp_path: Path):
    admin = as_role(client, tokens, "admin")
    data = tmp_path / "d.txt"
    data.write_text("x " * 100)
    plan_id = client.post("/api/plans", json=tiny_plan(), headers=admin).json()["id"]
    unnamed = client.post("/api/runs", json={"plan_id": plan_id, "run": {"data": {"path": str(data)}}},
                          headers=admin)
    assert unnamed.status_code == 201, unnamed.text
    assert unnamed.json()["name"] == "llama-140K sp2 512"
    listed = {r["id"]: r["name"] for r in client.get("/api/runs", headers=admin).json()}
    assert listed[unnamed.json()["id"]] == "llama-140K sp2 512"
    named = client.post("/api/runs", json={"plan_id": plan_id, "name": "mine", "run": {"data": {"path": str(data)}}},
                        headers=admin)
    assert named.json()["name"] == "mine"
