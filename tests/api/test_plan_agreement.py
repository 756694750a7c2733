"""A plan means one thing everywhere: the API, `ulab plan --effective`, `ulab plan` and `ulab train --dry-run`
agree field by field on the defaulted plan, and the dry run's DeepSpeed, Accelerate and TrainingArguments
settings say what the plan says."""
from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from backend.cli import app as ulab
from tests.api.conftest import as_role
from tests.plans import alst_plan
from tests.tiny import tiny_plan

RUN = {"steps": 4, "data": {"path": "examples/data/sample.txt"}}
MINIMAL = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB"}, "training": {"seq_len": 8192},
           "run": {**RUN, "model_path": "Qwen/Qwen3-4B"}}


def with_training(plan: dict, **training) -> dict:
    p = copy.deepcopy(plan)
    p["training"].update(training)
    return p


def sp_by_dp() -> dict:
    p = tiny_plan(sp_size=2, dp_size=2)
    return p | {"run": RUN}


PLANS = {
    "minimal": MINIMAL,
    "alst-all-on": alst_plan(8, 1) | {"run": {**RUN, "model_path": "meta-llama/Llama-3.1-8B"}},
    "cpu-tiny": tiny_plan() | {"run": RUN},
    "sp2-x-dp2": sp_by_dp(),
    "offload": with_training(MINIMAL, offload_optimizer=True, offload_params=True),
    "liger-bf16-comm": with_training(MINIMAL, liger_kernel=True, seq_parallel_communication_data_type="bf16"),
    **{f"zero-{z}": with_training(tiny_plan() | {"run": RUN}, zero_stage=z) for z in range(4)},
}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "config":
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def cli(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(ulab, list(args))
    return r.exit_code, r.stdout


@pytest.mark.parametrize("name", sorted(PLANS))
def test_api_effective_and_dry_run_agree(name, client, tokens, tmp_path):
    plan = PLANS[name]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    headers = as_role(client, tokens, "submitter")

    code, out = cli("plan", "--json", str(path), "--effective")
    assert code == 0, out
    effective = json.loads(out)
    api_effective = client.post("/api/plans/effective", json=plan, headers=headers).json()
    stored = client.post("/api/plans", json=plan, headers=headers).json()["plan"]
    code, out = cli("train", "--plan", str(path), "--run-dir", str(tmp_path / "run"), "--dry-run")
    assert code == 0, out
    dry = json.loads(out)
    assert flat(api_effective) == flat(effective) == flat(stored) == flat(dry["plan"])
    assert not (tmp_path / "run").exists()  # a dry run starts nothing
    asked = dry["plan"]["training"]["attn_implementation"]  # this machine: CPU ranks run sdpa, and say so
    assert dry["attention"]["requested"] == asked, dry["attention"]
    assert dry["attention"]["runs"] == "sdpa", dry["attention"]

    # the estimate is the same from the API and the command line, and reads the same defaulted plan
    code, out = cli("plan", "--json", str(path))
    assert code == 0
    assert json.loads(out) == client.post("/api/estimate", json=plan, headers=headers).json()

    # what the plan turns into says what the plan says
    t, ds, par, args = effective["training"], dry["deepspeed"], dry["parallelism"], dry["training_args"]
    z = ds["zero_optimization"]
    assert z["stage"] == t["zero_stage"]
    assert ("offload_optimizer" in z) == t["offload_optimizer"]
    assert ("offload_param" in z) == t["offload_params"]
    assert ds["train_micro_batch_size_per_gpu"] == args["per_device_train_batch_size"] == t["micro_batch_size"]
    assert ds["gradient_accumulation_steps"] == args["gradient_accumulation_steps"] == t["grad_accum"]
    assert ds["bf16"]["enabled"] == args["bf16"] == (t["dtype"] == "bf16")
    assert ds["fp16"]["enabled"] == args["fp16"] == (t["dtype"] == "fp16")
    assert ds["gradient_clipping"] == args["max_grad_norm"] == t["max_grad_norm"]
    assert args["activation_checkpointing"] == t["activation_checkpointing"]
    assert par["sp_size"] == effective["parallel"]["sp_size"]
    assert par["sp_backend"] == "deepspeed"
    assert par["dp_shard_size"] == effective["parallel"]["dp_size"]
    assert ds["seq_parallel_communication_data_type"] == t["seq_parallel_communication_data_type"]
    assert args["use_liger_kernel"] == t["liger_kernel"]
    assert ds["zero_force_ds_cpu_optimizer"] is True  # DeepSpeedCPUAdam whenever the optimizer is offloaded
    assert dry["stop_grace_s"] == effective["run"].get("stop_grace_s", dry["stop_grace_s"]) >= 30
    assert par["sp_attn_implementation"] == (t["attn_implementation"] if dry["device"] == "cuda" else "sdpa")
    assert args["max_steps"] == effective["run"]["steps"]
    assert args["learning_rate"] == effective["run"]["learning_rate"]


def test_the_minimal_plan_gets_the_alst_defaults_everywhere(client, tokens, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(MINIMAL))
    _, out = cli("plan", "--json", str(path), "--effective")
    t = json.loads(out)["training"]
    assert (t["zero_stage"], t["activation_checkpointing"], t["attn_implementation"]) == (3, True, "flash_attention_2")
    assert json.loads(out)["hardware"]["gpus_per_node"] == 1  # one default, the same in the API and the planner
    e = client.post("/api/estimate", json=MINIMAL, headers=as_role(client, tokens, "viewer")).json()
    assert e["valid"]
    assert e["memory"]["breakdown_gib"]["optimizer"] > 0  # ZeRO-3 on one GPU: states on it


MISSPELT = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB"},
            "training": {"seq_len": 8192, "offload_optimiser": True, "zero_stag": 1}}


def test_a_misspelt_key_is_refused_with_a_hint_everywhere(client, tokens, tmp_path):
    want = [{"field": "training.offload_optimiser", "message": "unknown field; did you mean offload_optimizer?"},
            {"field": "training.zero_stag", "message": "unknown field; did you mean zero_stage?"}]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(MISSPELT))
    code, out = cli("plan", "--json", str(path))
    assert code == 1
    assert json.loads(out)["errors"] == want
    code, out = cli("plan", "--json", str(path), "--effective")
    assert code == 1
    assert json.loads(out)["errors"] == want
    r = client.post("/api/estimate", json=MISSPELT, headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 422
    assert r.json()["detail"] == want
    r = client.post("/api/plans", json={**MISSPELT, "name": "x"}, headers=as_role(client, tokens, "submitter"))
    assert r.status_code == 422
    assert r.json()["detail"] == want
    path.write_text(json.dumps(MISSPELT | {"run": RUN | {"model_path": "Qwen/Qwen3-4B"}}))
    code, _ = cli("train", "--plan", str(path), "--run-dir", str(tmp_path / "r"), "--dry-run")
    assert code == 2


def test_defaults_endpoint_is_the_model(client, tokens):
    d = client.get("/api/plans/defaults", headers=as_role(client, tokens, "viewer")).json()
    assert d["defaults"]["training"]["zero_stage"] == 3
    assert d["defaults"]["hardware"]["gpus_per_node"] == 1
    assert d["choices"]["training.attn_implementation"] == ["flash_attention_2", "flash_attention_3", "sdpa",
                                                            "flex_attention", "eager"]
    assert d["plan"]["training"]["activation_checkpointing"] is True  # the example, defaulted


def test_the_page_and_the_cli_share_one_cpu_memory_default(client, tokens):
    """The page started from 1,900 GiB per node, `ulab plan` from 1,024."""
    from plan.model import Hardware

    d = client.get("/api/plans/defaults", headers=as_role(client, tokens, "viewer")).json()
    default = Hardware.model_fields["cpu_memory_gib_per_node"].default
    assert d["plan"]["hardware"]["cpu_memory_gib_per_node"] == default == 1024.0
    assert d["defaults"]["hardware"]["cpu_memory_gib_per_node"] == default
