"""plan.launch: the plan's DeepSpeed config, Accelerate YAML and torchrun argument list (pure, fast)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from plan.exports import launch_command
from plan.launch import (
    SHUTDOWN_TIMEOUT_ENV,
    accelerate_config_yaml,
    deepspeed_config,
    nodes_and_ranks_per_node,
    parallelism,
    stop_grace_s,
    torchrun_command,
    torchrun_env,
    torchrun_reads_shutdown_timeout,
    training_arguments,
)
from tests.tiny import tiny_plan


def plan(**training):
    t = {"seq_len": 4096, "micro_batch_size": 1, "grad_accum": 4, "dtype": "bf16", "zero_stage": 3,
         "offload_optimizer": True, "offload_params": True, "attn_implementation": "flash_attention_2"}
    t.update(training)
    return {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 2},
            "parallel": {"sp_size": 4, "dp_size": 2}, "training": t}


def test_deepspeed_config_follows_the_plan():
    ds = deepspeed_config(plan())
    z = ds["zero_optimization"]
    assert z["stage"] == 3
    assert z["offload_optimizer"]["device"] == "cpu"
    assert z["offload_param"]["device"] == "cpu"
    assert ds["bf16"]["enabled"] is True
    assert ds["fp16"]["enabled"] is False
    assert ds["train_micro_batch_size_per_gpu"] == 1
    assert ds["gradient_accumulation_steps"] == 4
    assert ds["train_batch_size"] == "auto"


def test_no_deepspeed_timer_synchronizes_the_device_inside_a_step():
    """Read by DeepSpeed's own config readers: the throughput timer (on and synchronizing unless the config says
    otherwise) and the per-phase wall-clock breakdown are off; and the Trainer's NaN filter, which reads every micro
    batch's loss on the host, is off."""
    from deepspeed.runtime.config import get_wall_clock_breakdown
    from deepspeed.utils.config import get_timers_config

    for z in (0, 2, 3):
        ds = deepspeed_config(plan(zero_stage=z, offload_optimizer=False, offload_params=False))
        timer = get_timers_config(ds)
        assert timer.enabled is False
        assert timer.synchronized is False
        assert get_wall_clock_breakdown(ds) is False
    from plan import validate

    p = validate({**plan(), "run": {"steps": 2, "data": {"path": "d.txt"}, "model_path": "m"}}).spec.plan
    assert training_arguments(p, p.stages()[0], cuda=True)["logging_nan_inf_filter"] is False


def test_sp_by_dp_gives_accelerate_the_data_parallel_degree():
    # Accelerate's train_batch_size is micro x accum x dp_shard_size; DeepSpeed's micro x accum x world / sp
    par = parallelism(plan())
    assert (par["sp_size"], par["dp_shard_size"]) == (4, 2)
    assert yaml.safe_load(accelerate_config_yaml(plan()))["parallelism_config"]["parallelism_config_dp_shard_size"] == 2


def test_offloaded_optimizer_is_deepspeed_cpu_adam_and_comm_dtype_passes_through():
    ds = deepspeed_config(plan())
    assert ds["zero_force_ds_cpu_optimizer"] is True  # Accelerate swaps torch AdamW for DeepSpeedCPUAdam
    assert ds["seq_parallel_communication_data_type"] == "fp32"  # DeepSpeed's default
    assert deepspeed_config(plan(seq_parallel_communication_data_type="bf16"))[
        "seq_parallel_communication_data_type"] == "bf16"


def test_liger_kernel_maps_to_transformers_use_liger_kernel():
    from plan import validate

    for on in (False, True):
        run = {"steps": 2, "data": {"path": "d.txt"}, "model_path": "m"}
        p = validate({**plan(liger_kernel=on), "run": run}).spec.plan
        assert training_arguments(p, p.stages()[0], cuda=True)["use_liger_kernel"] is on


def test_stop_grace_covers_a_zero3_save_and_reaches_torchrun():
    small = {**plan(), "model": tiny_plan()["model"]}
    assert stop_grace_s(small) == 30.0  # torchrun's own default is the floor
    big = {"model": {"preset": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
           "parallel": {"sp_size": 8}, "training": {"seq_len": 65536}}
    # 8B params: 12 B/param of optimizer shards + 2 B/param gathered model at 1 GB/s per node, plus 30 s
    assert 130 <= stop_grace_s(big) <= 150
    assert stop_grace_s({**big, "run": {"data": {"path": "d"}, "model_path": "m", "stop_grace_s": 900.0}}) == 900.0
    assert torchrun_env(141.2) == {SHUTDOWN_TIMEOUT_ENV: "142"}  # whole seconds, rounded up


def test_the_installed_torchrun_takes_the_grace_from_the_environment(monkeypatch):
    from torch.distributed.launcher.api import LaunchConfig

    assert torchrun_reads_shutdown_timeout() is True  # torch 2.13 here
    monkeypatch.setenv(SHUTDOWN_TIMEOUT_ENV, "142")
    assert LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1).shutdown_timeout == 142


# torch 2.11's torchrun options, copied from its usage message on the H100 check (the machine's torch 2.11.0+cu130;
# bench/results/logs/gpu-h100-2026-11-27-check-2.log), where `--shutdown-timeout` stopped both Ulysses rows with
# "unrecognized arguments". pyproject admits torch from 2.6.
TORCHRUN_2_11_OPTIONS = {
    "-h", "--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf",
    "--standalone", "--max-restarts", "--monitor-interval", "--start-method", "--event-log-handler", "--role", "-m",
    "--no-python", "--run-path", "--log-dir", "-r", "-t", "--tee", "--redirects", "--local-ranks-filter",
    "--duplicate-stdout-filters", "--duplicate-stderr-filters", "--node-rank", "--master-addr", "--master-port",
    "--local-addr", "--logs-specs", "--numa-binding", "--signals-to-handle", "--virtual-local-rank"}


@pytest.mark.parametrize("kw", [
    {"nproc_per_node": 2, "rank_logs": "logs", "resume": True},
    {"nproc_per_node": 4, "nnodes": 2, "node_rank": 1, "rdzv_endpoint": "10.0.0.1:29400", "rdzv_id": "r"}])
def test_torchrun_arguments_exist_in_torch_2_11(kw):
    cmd = torchrun_command("p.json", "d", **kw)
    torchrun = cmd[:cmd.index("worker.trainer.rank")]
    options = {a for a in torchrun if a.startswith("-")}
    assert options <= TORCHRUN_2_11_OPTIONS, options - TORCHRUN_2_11_OPTIONS


def test_the_exported_line_sets_the_grace_in_its_environment():
    from plan.validation import validate

    big = {"model": {"preset": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
           "parallel": {"sp_size": 8}, "training": {"seq_len": 65536}}
    line = launch_command(validate(big).spec)
    grace = torchrun_env(stop_grace_s(big))[SHUTDOWN_TIMEOUT_ENV]
    assert line.startswith(f"{SHUTDOWN_TIMEOUT_ENV}={grace} python -m torch.distributed.run ")
    assert "--shutdown-timeout" not in line


def test_deepspeed_config_without_offload_or_stage3():
    ds = deepspeed_config(plan(zero_stage=1, offload_optimizer=False, offload_params=False, dtype="fp32"))
    z = ds["zero_optimization"]
    assert z["stage"] == 1
    assert "offload_optimizer" not in z
    assert "offload_param" not in z
    assert not ds["bf16"]["enabled"]
    assert not ds["fp16"]["enabled"]


def test_buckets_shrink_to_a_tiny_model_only():
    tiny = plan()
    tiny["model"] = tiny_plan()["model"]
    assert deepspeed_config(tiny)["zero_optimization"]["reduce_bucket_size"] < 1e6
    assert deepspeed_config(plan())["zero_optimization"]["reduce_bucket_size"] == int(5e7)


def test_accelerate_yaml_parses_and_names_sp():
    cfg = yaml.safe_load(accelerate_config_yaml(plan()))
    assert cfg["distributed_type"] == "DEEPSPEED"
    assert cfg["num_processes"] == 8
    assert cfg["num_machines"] == 2
    # ZeRO stage and offload are the JSON's (one copy); the YAML names it, and zero.Init for ZeRO-3
    assert cfg["deepspeed_config"] == {"deepspeed_config_file": "deepspeed_config.json", "zero3_init_flag": True,
                                       "deepspeed_multinode_launcher": "standard"}
    pc = cfg["parallelism_config"]
    assert pc["parallelism_config_sp_size"] == 4
    assert pc["parallelism_config_sp_backend"] == "deepspeed"
    assert pc["parallelism_config_sp_attn_implementation"] == "flash_attention_2"


def test_torchrun_single_node_is_standalone_argument_list():
    cmd = torchrun_command("p.json", "runs/1", nproc_per_node=2, python="/py")
    assert cmd[:3] == ["/py", "-m", "torch.distributed.run"]
    assert "--standalone" in cmd
    assert cmd[cmd.index("--nproc-per-node") + 1] == "2"
    i = cmd.index("-m", 3)
    assert cmd[i + 1] == "worker.trainer.rank"  # the rank's entry point, not the launcher
    assert cmd[cmd.index("--plan") + 1] == "p.json"
    assert cmd[cmd.index("--run-dir") + 1] == "runs/1"
    assert "--resume" not in cmd
    assert "--resume" in torchrun_command("p.json", "d", nproc_per_node=1, resume=True)
    assert all(isinstance(a, str) for a in cmd)


def test_torchrun_multi_node_uses_c10d_rendezvous():
    cmd = torchrun_command("p.json", "d", nproc_per_node=4, nnodes=2, node_rank=1, rdzv_endpoint="10.0.0.1:29400",
                           rdzv_id="run-7")
    assert "--standalone" not in cmd
    for flag, value in [("--nnodes", "2"), ("--node-rank", "1"), ("--rdzv-backend", "c10d"),
                        ("--rdzv-endpoint", "10.0.0.1:29400"), ("--rdzv-id", "run-7")]:
        assert cmd[cmd.index(flag) + 1] == value
    with pytest.raises(ValueError):
        torchrun_command("p.json", "d", nproc_per_node=4, nnodes=2)


def test_nodes_and_ranks_per_node():
    assert nodes_and_ranks_per_node(plan()) == (2, 4)


def test_launch_config_does_not_import_torch():
    code = "import sys, plan.launch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
