"""The planner's exports load in the real libraries: the resolved DeepSpeed JSON in DeepSpeed's own
`DeepSpeedConfig` at the plan's data-parallel world size, and each node's Accelerate YAML in Accelerate's loader."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from plan.exports import export_files, exports
from plan.launch import MAIN_NODE_ENV
from tests.plans import qwen_plan

# sp 4 x dp 2 over two nodes of 4 GPUs, grad_accum 8: DeepSpeed's batch is 1 x 8 x 2 = 16
TWO_NODES = qwen_plan() | {"hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 2},
                           "parallel": {"sp_size": 4, "dp_size": 2}}

# DeepSpeedConfig reads the data-parallel world size from deepspeed.comm and the mpu (as under Ulysses): a
# one-process gloo group with an mpu that answers the plan's dp degree, in a fresh interpreter.
LOAD = textwrap.dedent("""
    import json, os, sys
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed.comm as dist
    from deepspeed.runtime.config import DeepSpeedConfig
    dist.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    class Mpu:
        def get_data_parallel_world_size(self):
            return int(sys.argv[2])
    for path in sys.argv[3:]:
        try:
            c = DeepSpeedConfig(json.loads(open(path).read()), mpu=Mpu())
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        else:
            print(json.dumps({"train_batch_size": c.train_batch_size, "zero_stage": c.zero_optimization_stage,
                              "offload": c.zero_config.offload_optimizer is not None,
                              "bf16_master_and_states": [c.bfloat16_config.bf16_master_weights_and_grads,
                                                         c.bfloat16_config.bf16_optimizer_states]}))
""")


def load_in_deepspeed(tmp_path, texts: list[str], dp: int) -> list[dict]:
    """What DeepSpeedConfig makes of each config text, in one fresh interpreter (importing DeepSpeed costs seconds)."""
    from worker.trainer.net import free_port

    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"ds{i}.json")
        paths[-1].write_text(text)
    proc = subprocess.run([sys.executable, "-c", LOAD, str(free_port()), str(dp), *map(str, paths)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.strip().splitlines()[-len(texts):]]


@pytest.mark.slow
def test_the_resolved_deepspeed_json_loads_in_deepspeed_and_the_trainer_variant_is_labelled(tmp_path):
    x = exports(TWO_NODES)
    # training.bf16_optimizer_states (it refuses offload_optimizer): DeepSpeed reads both bf16 keys from the export
    bf16 = exports(TWO_NODES | {"training": {**TWO_NODES["training"], "offload_optimizer": False,
                                             "offload_params": False, "zero_stage": 2,
                                             "bf16_optimizer_states": True}})
    resolved, for_trainer, bf16_states = load_in_deepspeed(
        tmp_path, [x["deepspeed_json"], x["deepspeed_json_hf_trainer"], bf16["deepspeed_json"]], dp=2)
    assert resolved == {"train_batch_size": 16, "zero_stage": 3, "offload": True,
                        "bf16_master_and_states": [False, False]}
    assert bf16_states == {"train_batch_size": 16, "zero_stage": 2, "offload": False,
                           "bf16_master_and_states": [True, True]}
    assert "auto" not in x["deepspeed_json"]
    # the Trainer variant keeps "auto" (Transformers fills it); DeepSpeed alone cannot read it, as the issue saw
    assert '"auto"' in x["deepspeed_json_hf_trainer"]
    assert "not supported between" in for_trainer["error"]


def test_one_accelerate_yaml_per_node_loads_in_accelerate(tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    x = exports(TWO_NODES)
    assert len(x["accelerate_yaml_per_node"]) == 2
    for rank, text in enumerate(x["accelerate_yaml_per_node"]):
        path = tmp_path / f"accelerate-node{rank}.yaml"
        path.write_text(text)
        config = load_config_from_file(str(path))
        assert (config.machine_rank, config.num_machines, config.num_processes) == (rank, 2, 8)
        # the main node's address comes on accelerate launch's command line (the sbatch script reads it from Slurm)
        assert (config.main_process_ip, config.main_process_port) == (None, 29500)
        assert config.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
        assert config.parallelism_config["parallelism_config_sp_size"] == 4


def test_one_torchrun_line_per_node_and_the_plan_json(tmp_path):
    x = exports(TWO_NODES)
    lines = x["launch_commands_per_node"]
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert f"--node-rank {rank}" in line
        assert f'--rdzv-endpoint "${MAIN_NODE_ENV}:${{MAIN_NODE_PORT:-29500}}"' in line
    assert json.loads(x["plan_json"])["parallel"] == {"sp_size": 4, "dp_size": 2}


def test_every_switch_the_estimate_counts_is_in_the_exports_in_each_tools_form():
    plan = TWO_NODES | {"training": {**TWO_NODES["training"], "liger_kernel": True, "activation_checkpointing": True,
                                     "checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True}}
    x = exports(plan)
    ds = json.loads(x["deepspeed_json"])
    # DeepSpeedConfig with no mpu divides the world by this (deepspeed/runtime/config.py)
    assert ds["sequence_parallel_size"] == 4
    assert ds["train_batch_size"] == 1 * 8 * 2
    args = json.loads(x["training_args_json"])
    ta = args["training_arguments"]
    assert ta["use_liger_kernel"]
    assert ta["activation_checkpointing"]
    assert ta["deepspeed"] == "deepspeed_config.json"
    assert all(args["alst"][k]["enabled"] for k in ("tiled_mlp", "tiled_logits_loss", "checkpoint_offload"))
    assert args["parallelism_config"] == {"sp_backend": "deepspeed", "sp_size": 4, "dp_shard_size": 2}
    # the YAML names the JSON, and carries no second copy of its settings
    assert "deepspeed_config_file: deepspeed_config.json" in x["accelerate_yaml"]
    assert "zero_stage" not in x["accelerate_yaml"]
    assert "offload_optimizer_device" not in x["accelerate_yaml"]


def test_a_single_node_needs_no_main_node_address():
    x = exports(qwen_plan())
    assert "main_process_ip" not in x["accelerate_yaml"]
    assert len(x["launch_commands_per_node"]) == 1
    assert "--standalone" in x["launch_commands_per_node"][0]


def test_the_sbatch_script_asks_for_the_plans_nodes_and_gpus_and_is_valid_bash(tmp_path):
    script = exports(TWO_NODES)["sbatch_script"]
    options = [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]
    assert {"--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=4", "--requeue"} <= set(options), options
    signal = next(o for o in options if o.startswith("--signal=B:TERM@"))
    assert int(signal.rsplit("@", 1)[1]) >= 30 + 30  # torchrun's stop floor and the margin, at least
    # one launcher per node, its node rank from Slurm, resuming from the newest checkpoint
    assert "ULAB_NODE_RANK=$SLURM_PROCID exec python -m worker.trainer" in script
    assert "--resume" in script
    assert "${MAIN_NODE_PORT:-29500}" in script
    assert 'ULAB_RDZV_ID="slurm-$SLURM_JOB_ID"' in script
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


# A placeholder a script could fill: an ALL_CAPS_NAME standing as a value, "<...>", "..." or "CHANGE_ME"-like words
PLACEHOLDER_VALUE = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$|<[^>]*>|\.\.\.|CHANGE|YOUR_|/path/to")
# in a script's commands, an ALL_CAPS_NAME that is neither expanded ($NAME, ${NAME...}) nor assigned (NAME=...)
BARE_NAME = re.compile(r"(?<![$\w{])([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b(?!=)")


def strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings(v)] + [k for k in value if isinstance(k, str)]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


@pytest.mark.parametrize("plan", [TWO_NODES, qwen_plan()], ids=["two-nodes", "one-node"])
def test_no_exported_file_holds_a_placeholder_a_script_could_fill(plan):
    import yaml
    from accelerate.utils import ComputeEnvironment, DistributedType

    enums = {e.value for e in (*ComputeEnvironment, *DistributedType)}  # Accelerate's own values, not placeholders
    files = export_files(plan | {"run": {"steps": 10, "data": {"path": "/data/train.jsonl"}}})
    for name, text in files.items():
        if name.endswith((".json", ".yaml")):
            values = strings(json.loads(text) if name.endswith(".json") else yaml.safe_load(text))
            assert [v for v in values if PLACEHOLDER_VALUE.search(v) and v not in enums] == [], name
        elif name.endswith((".sh", ".sbatch")):
            commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
            assert [line for line in commands if BARE_NAME.search(line) or PLACEHOLDER_VALUE.search(line)] == [], name
    assert MAIN_NODE_ENV not in files["accelerate_config_node0.yaml"]
    assert "replace" not in files["README.txt"]
    # the main node, from Slurm; the data, a named variable with the plan's path as its default
    script = files["ulab-job.sbatch"]
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in script
    assert 'export ULAB_DATA_PATH="${ULAB_DATA_PATH:-/data/train.jsonl}"' in script
    assert "accelerate launch --config_file \"accelerate_config_node$SLURM_PROCID.yaml\"" in script


def test_the_readme_and_the_script_say_which_kernels_the_nodes_need():
    fa3 = TWO_NODES | {"training": {**TWO_NODES["training"], "attn_implementation": "flash_attention_3",
                                    "liger_kernel": True}}
    files = export_files(fa3 | {"run": {"steps": 10, "data": {"path": "/data/train.jsonl"}}})
    for name in ("README.txt", "ulab-job.sbatch"):
        assert "Kernels: flash-attn-3 (flash_attn_interface), liger-kernel (must be installed on every node" \
            in files[name], name
    fa2 = export_files(qwen_plan() | {"run": {"steps": 10, "data": {"path": "/data/train.jsonl"}}})
    assert "Kernels: flash-attn (must be installed" in fa2["README.txt"]
    sdpa = qwen_plan()
    sdpa = sdpa | {"training": {**sdpa["training"], "attn_implementation": "sdpa"}}
    plain = export_files(sdpa | {"run": {"steps": 10, "data": {"path": "/data/train.jsonl"}}})
    assert "Kernels: no kernel package beyond the trainer's install." in plain["README.txt"]
