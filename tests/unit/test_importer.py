"""Importing a user's DeepSpeed / Accelerate / Trainer setup (plan.importer): the guide's setup, an Accelerate YAML,
a setup that already works (the planner's own exports), malformed input and unknown nested keys."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import plan as planner
from plan import importer
from plan.model import EXAMPLE

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "imports"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def fields(notes: list[dict]) -> list[str]:
    return [n["field"] for n in notes]


def guide() -> dict:
    return importer.import_setup(importer.parse_json(fixture("guide_ds_config.json"), "ds_config"),
                                 fixture("guide_launch.txt"))


def test_the_guide_setup_names_the_ignored_block_the_trainer_mismatches_and_the_impossible_layout():
    r = guide()
    # DeepSpeed reads no `sequence_parallelism` block: the warning names it and what sets Ulysses instead
    block = r["warnings"][0]
    assert block["field"] == "sequence_parallelism"
    assert "DeepSpeed ignores this block" in block["message"]
    assert "parallelism_config.sp_size" in block["message"]
    assert "sequence_parallel_size" in block["message"]
    assert "degree" in block["message"]
    # the Trainer checks fp16 and gradient_accumulation_steps against its own arguments, which the launch line
    # leaves at their defaults (False, 1): both named, with the argument that fixes each
    by_field = {w["field"]: w["message"] for w in r["warnings"]}
    assert sorted(by_field) == ["fp16.enabled", "gradient_accumulation_steps", "sequence_parallelism"]
    assert "--gradient_accumulation_steps 4" in by_field["gradient_accumulation_steps"]
    assert "default is 1" in by_field["gradient_accumulation_steps"]
    assert "pass --fp16" in by_field["fp16.enabled"]
    # one error, naming both sides: the launcher's 32 GPUs on one node and the node's 8
    assert r["errors"] == [{"field": "--num_gpus", "message": "--num_gpus=32 on one node, but a node has 8 "
                            "(hardware.gpus_per_node); the plan spreads the 32 ranks over 4 nodes"}]
    p = r["plan"]
    assert p["model"] == {"preset": "meta-llama/Llama-3.1-8B"}  # Meta-Llama-3-8B's architecture
    assert p["hardware"]["gpus_per_node"] == 8
    assert p["hardware"]["num_nodes"] == 4
    assert p["parallel"] == {"sp_size": 1, "dp_size": 32}  # nothing the libraries read turns Ulysses on
    t = p["training"]
    assert (t["seq_len"], t["micro_batch_size"], t["grad_accum"], t["dtype"], t["zero_stage"]) == \
        (524288, 1, 4, "fp16", 3)
    assert t["offload_optimizer"]
    assert t["offload_params"]
    assert t["max_grad_norm"] == 1.0
    # what the setup leaves to defaults is listed with the value it takes
    assert {"training.attn_implementation", "training.activation_checkpointing", "hardware.gpu",
            "hardware.gpus_per_node", "model.preset"} <= set(fields(r["defaults"]))
    # estimated at once: 512K tokens on one GPU without Ulysses does not fit an H100
    assert r["estimate"]["valid"]
    assert r["estimate"]["memory"]["fits"] is False


def test_an_accelerate_yaml_with_parallelism_config_maps_ulysses_nodes_and_offload():
    r = importer.import_setup(None, fixture("accelerate_sp_launch.txt"),
                              importer.parse_yaml(fixture("accelerate_sp.yaml"), "accelerate_config"))
    assert r["errors"] == []
    assert r["warnings"] == []
    p = r["plan"]
    assert p["hardware"]["gpus_per_node"] == 8
    assert p["hardware"]["num_nodes"] == 2
    assert p["parallel"] == {"sp_size": 8, "dp_size": 2}
    t = p["training"]
    assert (t["zero_stage"], t["offload_optimizer"], t["offload_params"], t["grad_accum"], t["dtype"]) == \
        (3, True, False, 2, "bf16")
    assert t["attn_implementation"] == "flash_attention_2"
    assert t["activation_checkpointing"]
    assert t["liger_kernel"]
    assert t["seq_len"] == 131072
    assert p["model"] == {"preset": "Qwen/Qwen3-8B"}
    assert r["estimate"]["valid"]


def test_the_planners_own_exports_import_back_to_the_same_plan_without_a_warning():
    ex = planner.exports(EXAMPLE)
    launch = ("accelerate launch --config_file accelerate.yaml train.py --deepspeed ds_config.json "
              "--model_name_or_path Qwen/Qwen3-4B --max_seq_length 65536 --per_device_train_batch_size 1 "
              "--gradient_accumulation_steps 8 --bf16 --gradient_checkpointing --attn_implementation flash_attention_2")
    r = importer.import_setup(json.loads(ex["deepspeed_json_hf_trainer"]), launch,
                              importer.parse_yaml(ex["accelerate_yaml"], "accelerate_config"),
                              gpus_per_node=EXAMPLE["hardware"]["gpus_per_node"], gpu="H100-80GB")
    assert r["errors"] == []
    assert r["warnings"] == []
    original = planner.Plan.model_validate(EXAMPLE).effective()
    for section in ("model", "parallel", "training"):
        assert r["plan"][section] == original[section], section
    assert r["plan"]["hardware"]["gpus_per_node"] == 4
    assert r["plan"]["hardware"]["num_nodes"] == 1
    assert r["estimate"] == planner.estimate(r["plan"])


def test_auto_values_without_a_trainer_argument_are_listed_as_the_default_they_take():
    ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": True},
          "zero_optimization": {"stage": 2}}
    r = importer.import_setup(ds, "torchrun --nproc_per_node 8 train.py --deepspeed ds.json --model_name_or_path "
                                  "Qwen/Qwen3-4B --max_seq_length 8192 --bf16")
    notes = {d["field"]: d["message"] for d in r["defaults"]}
    assert "per_device_train_batch_size=8" in notes["train_micro_batch_size_per_gpu"]
    assert "gradient_accumulation_steps=1" in notes["gradient_accumulation_steps"]
    assert r["plan"]["training"]["micro_batch_size"] == 8
    assert r["plan"]["training"]["grad_accum"] == 1
    assert r["errors"] == []


def test_a_trainer_argument_that_contradicts_the_deepspeed_config_is_an_error_naming_both():
    r = importer.import_setup({"gradient_accumulation_steps": 4, "zero_optimization": {"stage": 3}},
                              "deepspeed --num_gpus 8 train.py --deepspeed ds.json --model_name_or_path Qwen/Qwen3-4B "
                              "--max_seq_length 8192 --gradient_accumulation_steps 2")
    [e] = r["errors"]
    assert e["field"] == "gradient_accumulation_steps"
    assert "gradient_accumulation_steps=4" in e["message"]
    assert "--gradient_accumulation_steps=2" in e["message"]


def test_unknown_nested_keys_are_named_never_dropped():
    ds = {"zero_optimization": {"stage": 3, "offload_optimiser": {"device": "cpu"}}, "bf16": {"enable": True},
          "gradient_clipping": 1.0, "my_block": {"x": 1}}
    yaml_text = ("distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  zero_stage: 3\n"
                 "  offload_optimizer_devce: cpu\nparallelism_config:\n  parallelism_config_sp_sise: 4\n")
    r = importer.import_setup(ds, "accelerate launch train.py --model_name_or_path Qwen/Qwen3-4B --max_seq_length 8192",
                              importer.parse_yaml(yaml_text, "accelerate_config"))
    errors = {e["field"]: e["message"] for e in r["errors"]}
    warnings = {w["field"]: w["message"] for w in r["warnings"]}
    # DeepSpeed's ZeRO and bf16 models forbid unknown keys: deepspeed.initialize would stop
    assert "did you mean offload_optimizer?" in errors["zero_optimization.offload_optimiser"]
    assert "did you mean enabled?" in errors["bf16.enable"]
    # Accelerate turns unknown keys of its sections into arguments nothing reads
    assert "did you mean offload_optimizer_device?" in warnings["deepspeed_config.offload_optimizer_devce"]
    assert "did you mean parallelism_config_sp_size?" in warnings["parallelism_config.parallelism_config_sp_sise"]
    assert "x" in warnings["my_block"]  # a top-level block nothing reads, with its keys
    # and the typo'd offload did not turn into an offload
    assert r["plan"]["training"]["offload_optimizer"] is False


@pytest.mark.parametrize("parse,text,line", [
    (importer.parse_json, '{\n  "zero_optimization": {\n    "stage": 3,\n  }\n}', 4),
    (importer.parse_json, '{"a": 1}\n{"b": 2}', 2),
    (importer.parse_yaml, "num_processes: 8\ndeepspeed_config:\n  zero_stage: 3\n bad: [\n", 4),
])
def test_malformed_input_names_its_line(parse, text, line):
    with pytest.raises(importer.InputError) as e:
        parse(text, "ds_config")
    assert e.value.line == line
    assert f"line {line}" in str(e.value)


def test_launch_lines_of_each_launcher():
    assert importer.parse_launch("deepspeed --num_nodes 2 --num_gpus 8 t.py --bf16").options == \
        {"num_nodes": 2, "num_gpus": 8}
    run = importer.parse_launch("NCCL_DEBUG=INFO python -m torch.distributed.run --nproc-per-node=4 --nnodes 1:2 "
                                "--standalone train.py --bf16 --max_seq_length=4096")
    assert run.launcher == "torchrun"
    assert run.options["nproc_per_node"] == 4
    assert run.options["standalone"] is True
    assert run.script_args == {"bf16": True, "max_seq_length": 4096}
    with pytest.raises(importer.InputError):
        importer.parse_launch("srun train.py")


ODD = [None, "x", "auto", -1, 0, 2.5, 10**12, True, [], {}, {"device": 7}]
DS_PATHS = [("zero_optimization", "stage"), ("zero_optimization", "offload_optimizer"), ("zero_optimization",
            "offload_param"), ("zero_optimization", "cpu_offload"), ("bf16", "enabled"), ("fp16", "enabled"),
            ("gradient_accumulation_steps",), ("gradient_clipping",), ("train_micro_batch_size_per_gpu",),
            ("train_batch_size",), ("sequence_parallel_size",), ("zero_optimization",), ("bf16",)]
LAUNCH = "deepspeed --num_gpus {v} --num_nodes {v} train.py --deepspeed d.json --model_name_or_path {v} " \
         "--max_seq_length {v} --per_device_train_batch_size {v} --attn_implementation {v} --bf16 {v}"


@pytest.mark.parametrize("path", DS_PATHS, ids=".".join)
def test_odd_values_anywhere_are_errors_never_a_crash(path):
    for value in ODD:
        ds: dict = {"zero_optimization": {"stage": 3}}
        node = ds
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        r = importer.import_setup(ds, "deepspeed --num_gpus 8 train.py --deepspeed d.json --model_name_or_path "
                                      "Qwen/Qwen3-4B --max_seq_length 4096")
        assert set(r) == {"plan", "warnings", "errors", "defaults", "estimate"}, (path, value)


@pytest.mark.parametrize("value", ["x", "0", "-3", "1:x", "99999999", "auto", "''"])
def test_odd_launch_values_are_errors_never_a_crash(value):
    for line in (LAUNCH.format(v=value), f"torchrun --nproc_per_node {value} --nnodes {value} t.py",
                 f"accelerate launch --num_processes {value} --num_machines {value} t.py "
                 f"--parallelism_config_sp_size {value}"):
        r = importer.import_setup({"zero_optimization": {"stage": 3}}, line)
        assert r["errors"], line
