"""What a run will cost, from the API and the command line alike: `train_tokens` turns an estimate into wall time and
GPU-hours with a range; recommend ranks by that time; a bad budget is a 4xx naming the field."""
from __future__ import annotations

import json
import math

from typer.testing import CliRunner

from backend.cli import app as ulab
from plan import estimate
from tests.api.conftest import as_role
from tests.api.test_plan_agreement import cli

PLAN = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4},
        "parallel": {"sp_size": 8, "dp_size": 4}, "training": {"seq_len": 131072, "grad_accum": 1}}


def test_estimate_answers_the_cost_of_a_token_budget(client, tokens, tmp_path):
    headers = as_role(client, tokens, "viewer")
    e = client.post("/api/estimate", params={"train_tokens": 20_000_000_000}, json=PLAN, headers=headers).json()
    c, t = e["cost"], e["throughput"]
    per_step = 131072 * 4                                        # seq_len x dp (micro batch 1, grad_accum 1)
    assert c["steps"] == math.ceil(20e9 / per_step)
    assert c["gpus"] == 32
    assert abs(c["wall_time_s"] - c["steps"] * t["step_time_s"]) < 1e-4 * c["wall_time_s"]   # step time: 6 digits
    assert c["gpu_hours"] == round(c["wall_time_s"] * 32 / 3600, 2)
    lo, hi = c["wall_time_s_range"]
    assert lo < c["wall_time_s"] < hi
    assert abs(lo / c["wall_time_s"] - t["step_time_s_range"][0] / t["step_time_s"]) < 1e-3
    assert c["summary"].startswith("about ")
    assert "GPU-hours" in c["summary"]
    # without a budget (and without a run section) there is no cost
    assert client.post("/api/estimate", json=PLAN, headers=headers).json()["cost"] is None

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    code, out = cli("plan", "--json", str(path), "--train-tokens", "2e10")
    assert code == 0, out
    assert json.loads(out)["cost"] == c                          # the command line says the same
    code, out = cli("plan", "--json", str(path), "--train-tokens", "2e10", "--text")
    assert f"run cost: {c['summary']}" in out


def test_a_run_section_is_a_budget_of_steps_per_stage():
    plan = {**PLAN, "run": {"data": {"path": "data.txt"}, "stages": [{"seq_len": 32768, "steps": 100},
                                                                     {"seq_len": 131072, "steps": 50}]}}
    c = estimate(plan)["cost"]
    short = estimate({**PLAN, "training": {**PLAN["training"], "seq_len": 32768}})["throughput"]["step_time_s"]
    long = estimate(PLAN)["throughput"]["step_time_s"]
    assert c["source"] == "run.stages"
    assert c["steps"] == 150
    assert c["train_tokens"] == 100 * 32768 * 4 + 50 * 131072 * 4
    assert abs(c["wall_time_s"] - (100 * short + 50 * long)) < 0.01 * c["wall_time_s"]


def test_a_bad_budget_is_a_4xx_naming_the_field(client, tokens, tmp_path):
    headers = as_role(client, tokens, "viewer")
    for bad in (0, -5, "lots", 10**16):
        r = client.post("/api/estimate", params={"train_tokens": bad}, json=PLAN, headers=headers)
        assert r.status_code == 422, (bad, r.text)
        assert "train_tokens" in r.text
    r = client.post("/api/estimate/recommend", json={"plan": PLAN, "train_tokens": 0}, headers=headers)
    assert r.status_code == 422
    assert "train_tokens" in r.text
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    r = CliRunner().invoke(ulab, ["plan", "--json", str(path), "--train-tokens", "0"])
    assert r.exit_code == 2
    assert "--train-tokens: Input should be greater than or equal to 1" in r.stderr


def test_recommend_ranks_by_the_time_to_the_budget(client, tokens):
    plan = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
            "training": {"seq_len": 65536}}
    body = {"plan": plan, "train_tokens": 1_000_000_000}
    recs = client.post("/api/estimate/recommend", json=body, headers=as_role(client, tokens, "viewer")).json()
    recs = recs["recommendations"]
    assert len(recs) >= 2
    fits = [r for r in recs if r["estimate"]["memory"]["verdict"] == "fits"]
    times = [r["estimate"]["cost"]["wall_time_s"] for r in fits]
    assert times == sorted(times)
    assert all(r["estimate"]["cost"]["train_tokens"] >= 1_000_000_000 for r in recs)
