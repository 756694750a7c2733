"""What a plan means to the launchers: the DeepSpeed config, an Accelerate config file and the torchrun command.

Pure functions of the plan (plan-v1 + the trainer-v1 `run` section). No torch import here: the planner imports this
module for its "exports" and must stay fast.
"""
from __future__ import annotations

import sys
from pathlib import Path

_DTYPES = {"fp32", "bf16", "fp16"}


def _training(plan: dict) -> dict:
    return plan.get("training") or {}


def parallel_sizes(plan: dict) -> tuple[int, int]:
    """(sp_size, dp_size) of a plan; both default to 1."""
    par = plan.get("parallel") or {}
    return int(par.get("sp_size", 1) or 1), int(par.get("dp_size", 1) or 1)


def world_size(plan: dict) -> int:
    sp, dp = parallel_sizes(plan)
    return sp * dp


def nodes_and_ranks_per_node(plan: dict) -> tuple[int, int]:
    """(num_nodes, ranks per node): the plan's world (sp*dp) spread evenly over `hardware.num_nodes`."""
    hw = plan.get("hardware") or {}
    nnodes = int(hw.get("num_nodes", 1) or 1)
    world = world_size(plan)
    return nnodes, max(1, world // nnodes)


def approx_param_count(plan: dict) -> int | None:
    """Parameters of a decoder-only model from `model.config` (None for a preset without a config)."""
    cfg = (plan.get("model") or {}).get("config")
    if not isinstance(cfg, dict):
        return None
    try:
        h, layers, heads = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
        kv = cfg.get("num_key_value_heads", heads)
        hd = cfg.get("head_dim") or h // heads
        inter, vocab = cfg.get("intermediate_size", 4 * h), cfg["vocab_size"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    per_layer = 2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h


def deepspeed_config(plan: dict) -> dict:
    """The DeepSpeed config the trainer hands to Transformers/Accelerate for this plan.

    Optimizer and scheduler are left to the Transformers Trainer (torch AdamW + its LR schedule), so the
    same config works for ZeRO 1/2/3 with or without offload; `train_batch_size` is "auto" because
    the Trainer computes it from the world size.
    """
    t = _training(plan)
    stage = int(t.get("zero_stage", 2))
    dtype = t.get("dtype", "bf16")
    # communication buckets: 5e7 elements, but never more than the model (a tiny model would be dwarfed by them)
    n_params = approx_param_count(plan)
    bucket = int(5e7 if n_params is None else max(1e5, min(5e7, n_params)))
    zero: dict = {
        "stage": stage,
        "overlap_comm": False,
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
        "allgather_bucket_size": bucket,
    }
    if stage == 3:
        zero.update({"stage3_gather_16bit_weights_on_model_save": True,
                     "stage3_prefetch_bucket_size": bucket, "stage3_param_persistence_threshold": 1e4})
    if t.get("offload_optimizer"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if t.get("offload_params") and stage == 3:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": int(t.get("micro_batch_size", 1)),
        "gradient_accumulation_steps": int(t.get("grad_accum", 1)),
        "train_batch_size": "auto",
        "gradient_clipping": float(t.get("max_grad_norm", 1.0)),
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        # the Trainer's torch AdamW is allowed to run with optimizer offload (DeepSpeedCPUAdam needs a C++ build)
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def _yaml_scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float)):
        return repr(v)
    s = str(v)
    return s if s.replace("_", "").replace("-", "").replace(".", "").isalnum() else '"' + s.replace('"', '\\"') + '"'


def _yaml(d: dict, indent: int = 0) -> str:
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append(" " * indent + f"{k}:")
            lines.append(_yaml(v, indent + 2))
        else:
            lines.append(" " * indent + f"{k}: {_yaml_scalar(v)}")
    return "\n".join(lines)


def accelerate_config_yaml(plan: dict) -> str:
    """An `accelerate launch --config_file` YAML equivalent to what the trainer sets up in code."""
    t = _training(plan)
    sp, dp = parallel_sizes(plan)
    nnodes, per_node = nodes_and_ranks_per_node(plan)
    stage = int(t.get("zero_stage", 2))
    dtype = t.get("dtype", "bf16")
    ds = {
        "zero_stage": stage,
        "gradient_accumulation_steps": int(t.get("grad_accum", 1)),
        "gradient_clipping": float(t.get("max_grad_norm", 1.0)),
        "offload_optimizer_device": "cpu" if t.get("offload_optimizer") else "none",
        "offload_param_device": "cpu" if (t.get("offload_params") and stage == 3) else "none",
        "zero3_init_flag": stage == 3,
    }
    if stage == 3:
        ds["zero3_save_16bit_model"] = True
    cfg = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": ds,
        "mixed_precision": {"bf16": "bf16", "fp16": "fp16"}.get(dtype, "no"),
        "num_machines": nnodes,
        "num_processes": sp * dp,
        "machine_rank": 0,
        "rdzv_backend": "c10d" if nnodes > 1 else "static",
        "same_network": True,
        "parallelism_config": {
            "parallelism_config_sp_size": sp,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": t.get("attn_implementation", "sdpa"),
        },
        "use_cpu": False,
    }
    return _yaml(cfg) + "\n"


def torchrun_command(
    plan_path,
    run_dir,
    *,
    resume: bool = False,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The argument list that starts the trainer's ranks on this node (never a shell string).

    One node: `--standalone` (a private c10d store on a free local port, so concurrent runs never collide).
    Several nodes: c10d rendezvous at `rdzv_endpoint` (host:port) under `rdzv_id`; every node runs the same
    list with its own `node_rank`. c10d assigns the global ranks; node_rank is passed for logs and for
    the static fallback only.
    """
    if nproc_per_node < 1:
        raise ValueError("nproc_per_node must be at least 1")
    cmd = [str(python), "-m", "torch.distributed.run", "--nproc-per-node", str(int(nproc_per_node))]
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ValueError("a run over several nodes needs rdzv_endpoint (host:port of the rendezvous)")
        cmd += ["--nnodes", str(int(nnodes)), "--node-rank", str(int(node_rank)),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", str(rdzv_endpoint),
                "--rdzv-id", str(rdzv_id or "ulab"), "--rdzv-conf", "join_timeout=120"]
    else:
        cmd += ["--standalone", "--nnodes", "1"]
    cmd += ["--max-restarts", "0", "-m", "worker.trainer",
            "--plan", str(Path(plan_path)), "--run-dir", str(Path(run_dir))]
    if resume:
        cmd.append("--resume")
    return cmd
