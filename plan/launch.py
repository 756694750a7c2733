"""What a plan turns into at launch: the DeepSpeed config, the Accelerate parallelism settings and config file, the
TrainingArguments the trainer builds, and the torchrun command. The trainer builds its run from these very
functions, so what `ulab train --dry-run` prints and what a user copies from the planner is what runs.

Pure functions (no torch): `ulab plan`, the API and the trainer's dry run call them in microseconds.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import yaml

from .errors import first_line
from .memory import zero_bucket_elements
from .model import Plan, StagePlan
from .validation import Spec, validate

SP_BACKEND = "deepspeed"
# Stopping a run (SIGTERM): the ranks finish the step and save a checkpoint, so the grace before SIGKILL must cover
# a ZeRO-3 save. Bytes a save writes per parameter: fp32 master weights + Adam's two moments (12, spread over the
# ranks' optimizer shards, written in parallel by every node) and the 16-bit model that rank 0 gathers and writes
# (2, one node). The write rate is an assumption, not a measurement: 1 GB/s sustained per node to the run
# directory (a shared NFS/Lustre client; local NVMe is faster), so the default errs on the long side. The floor
# is torchrun's own default shutdown timeout (30 s, torch/distributed/launcher/api.py).
SAVE_SHARD_BYTES_PER_PARAM = 12
SAVE_GATHERED_BYTES_PER_PARAM = 2
SAVE_WRITE_BYTES_PER_S_PER_NODE = 1e9
MIN_STOP_GRACE_S = 30.0
# Multi-node exports: the main node's address is not known to the planner. The sbatch script derives it from
# SLURM_JOB_NODELIST; the by-hand launch lines read it from this environment variable (export it on every node), and
# an `accelerate launch` gets it as --main_process_ip: no exported file names it. The port is torchrun's default.
MAIN_NODE_ENV = "MAIN_NODE_IP"
RDZV_PORT = 29500
MAIN_NODE_PORT = "MAIN_NODE_PORT"  # the torchrun lines read it when set (a port other than RDZV_PORT)
# A stop, in order (the one place these times are set): SIGTERM reaches `ulab train`, which forwards it once to
# torchrun, which sends it to every rank; the ranks have `stop_grace_s` to finish the step and save (torchrun's
# --shutdown-timeout), then torchrun SIGKILLs them. `ulab train` gives torchrun TORCHRUN_EXIT_S more to exit, then
# SIGKILLs whatever of the attempt is still running. The worker waits `stop_grace_s` + ULAB_CANCEL_GRACE_S
# (worker/tasks.py stop_wait_s) before it does the same, and then checks that nothing is left.
TORCHRUN_EXIT_S = 5.0


def as_spec(data: Any) -> Spec:
    """A Spec from a plan dict, a Plan or a Spec; ValueError naming the first broken field otherwise."""
    if isinstance(data, Spec):
        return data
    v = validate(data)
    if v.spec is None:
        raise ValueError(first_line(v.errors))
    return v.spec


def nodes_and_ranks_per_node(data: Any) -> tuple[int, int]:
    """(num_nodes, ranks per node): the plan's world (sp*dp) spread evenly over `hardware.num_nodes`."""
    plan = as_spec(data).plan
    nnodes = plan.hardware.num_nodes
    return nnodes, max(1, plan.world_size // nnodes)


# The training data, when set: it replaces the plan's run.data.path (worker/trainer/spec.py), so an exported job runs on
# another copy of the data without an edit to plan.json (the sbatch script names it)
DATA_PATH_ENV = "ULAB_DATA_PATH"
# attention kernels that are packages of their own: (module Transformers imports, the package to install); the
# trainer checks the module before its ranks start (worker/trainer/spec.py), the export's README names the package
ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                      "flash_attention_3": ("flash_attn_interface", "flash-attn-3 (flash_attn_interface)")}
# training.liger_kernel's Triton kernels (pyproject's `gpu` extra)
LIGER_PACKAGE = "liger-kernel"


def kernel_packages(plan: Plan) -> list[str]:
    """The packages beyond the trainer's own install that a GPU node needs for this plan's kernels."""
    attn = ATTENTION_PACKAGES.get(plan.training.attn_implementation)
    return [*([attn[1]] if attn else []), *([LIGER_PACKAGE] if plan.training.liger_kernel else [])]


def effective_attn(plan: Plan, cuda: bool) -> str:
    """The attention kernel a run uses: the plan's on CUDA; sdpa on CPU ranks (the flash kernels need CUDA)."""
    return plan.training.attn_implementation if cuda else "sdpa"


def bf16_block(dtype: str, bf16_optimizer_states: bool) -> dict:
    """DeepSpeed's `bf16` section. `training.bf16_optimizer_states` sets both keys DeepSpeed 0.19.8 reads
    (runtime/precision_config.py:63 bf16_master_weights_and_grads, :68 bf16_optimizer_states; runtime/config.py:710-714
    asserts ZeRO 1-3 and that the first is on with the second): ZeRO keeps its master partition in bf16
    (runtime/base_optimizer.py:484-526 `_configure_master_weights` returns torch.bfloat16) and torch AdamW's moments
    follow the master dtype."""
    block: dict[str, Any] = {"enabled": dtype == "bf16"}
    if bf16_optimizer_states:
        block.update({"bf16_master_weights_and_grads": True, "bf16_optimizer_states": True})
    return block


def deepspeed_config(data: Any) -> dict:
    """The DeepSpeed config the trainer hands to Transformers/Accelerate for this plan.

    Optimizer and scheduler are left to the Transformers Trainer (torch AdamW + its LR schedule), so the same
    config works for ZeRO 0-3 with or without offload; `train_batch_size` is "auto" because the Trainer
    computes it from the world size.
    """
    spec = as_spec(data)
    t = spec.plan.training
    bucket = zero_bucket_elements(spec.model.total_params)
    zero: dict[str, Any] = {"stage": t.zero_stage, "overlap_comm": False, "contiguous_gradients": True,
                            "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if t.zero_stage == 3:
        zero.update({"stage3_gather_16bit_weights_on_model_save": True, "stage3_prefetch_bucket_size": bucket,
                     "stage3_param_persistence_threshold": 1e4})
    if t.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if t.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config = {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": "auto",
        "gradient_clipping": t.max_grad_norm,
        "zero_optimization": zero,
        "bf16": bf16_block(t.dtype, t.bf16_optimizer_states),
        "fp16": {"enabled": t.dtype == "fp16"},
        # With the optimizer offloaded, Accelerate swaps the Trainer's torch AdamW for DeepSpeedCPUAdam (same
        # lr, betas, eps, weight decay; accelerate/utils/deepspeed.py map_pytorch_optim_to_deepspeed): the
        # multi-threaded SIMD Adam that ALST and the planner's optimizer-step time assume.
        "zero_force_ds_cpu_optimizer": True,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        # no timer may synchronize the device inside a step: the per-phase breakdown is off, and the throughput
        # timer (on and synchronizing by default: deepspeed/utils/config.py DeepSpeedThroughputTimerConfig, read
        # under "timers" / "throughput"; engine.py starts it in forward and stops it in step) is off; the trainer
        # times its own phases with CUDA events (worker/trainer/phases.py)
        "wall_clock_breakdown": False,
        "timers": {"throughput": {"enabled": False, "synchronized": False}},
    }
    # the dtype of the gradient reduction under sequence parallelism (DeepSpeed's key; it applies it when sp > 1)
    config["seq_parallel_communication_data_type"] = t.seq_parallel_communication_data_type
    # DeepSpeedConfig with no mpu (a user's own script, HF's zero.Init) takes its data-parallel world as
    # world / sequence_parallel_size (deepspeed/runtime/config.py DeepSpeedConfig.__init__); with Accelerate's mpu
    # the key is not read
    config["sequence_parallel_size"] = spec.sp
    return config


def stop_grace_s(data: Any) -> float:
    """Seconds between SIGTERM and SIGKILL when a run is stopped: `run.stop_grace_s`, or the time a ZeRO-3
    checkpoint of the model takes to write (see SAVE_* above), never under torchrun's own 30 s."""
    spec = as_spec(data)
    run = spec.plan.run
    if run is not None and run.stop_grace_s is not None:
        return float(run.stop_grace_s)
    n = spec.model.total_params
    written = SAVE_SHARD_BYTES_PER_PARAM * n / spec.plan.hardware.num_nodes + SAVE_GATHERED_BYTES_PER_PARAM * n
    return float(round(MIN_STOP_GRACE_S + written / SAVE_WRITE_BYTES_PER_S_PER_NODE))


def stop_grace_or_floor(data: Any) -> float:
    """`stop_grace_s` of a plan, or torchrun's 30 s floor for one this version cannot read (a stored plan)."""
    try:
        return stop_grace_s(data)
    except ValueError:
        return MIN_STOP_GRACE_S


def launcher_stop_wait_s(data: Any) -> float:
    """How long `ulab train` waits for torchrun after forwarding a stop before it SIGKILLs the attempt."""
    return stop_grace_or_floor(data) + TORCHRUN_EXIT_S


def parallelism(data: Any, seq_len: int | None = None, cuda: bool = True) -> dict:
    """What the trainer passes to Accelerate's `ParallelismConfig` (and its DeepSpeed SP handler)."""
    plan = as_spec(data).plan
    # dp_shard_size is the data-parallel degree: Accelerate's train_batch_size (micro x accum x dp_shard) must
    # equal DeepSpeed's (micro x accum x world / sp), or DeepSpeed's batch-size assertion stops every sp x dp run
    return {"sp_size": plan.parallel.sp_size, "dp_shard_size": plan.parallel.dp_size, "sp_backend": SP_BACKEND,
            "sp_seq_length": seq_len if seq_len is not None else plan.training.seq_len,
            "sp_seq_length_is_variable": True, "sp_attn_implementation": effective_attn(plan, cuda)}


def training_arguments(plan: Plan, stage: StagePlan, cuda: bool) -> dict:
    """The Transformers `TrainingArguments` a stage is built with (beyond paths, DeepSpeed and parallelism)."""
    t, run = plan.training, plan.run
    seed = run.seed if run is not None else 0
    return {
        "per_device_train_batch_size": t.micro_batch_size,
        "gradient_accumulation_steps": t.grad_accum,
        "max_steps": stage.steps,
        "learning_rate": stage.learning_rate,
        "lr_scheduler_type": stage.lr_scheduler,
        "warmup_steps": stage.warmup_steps,
        "weight_decay": run.weight_decay if run is not None else 0.0,
        "max_grad_norm": t.max_grad_norm,
        "optim": "adamw_torch_fused",  # DeepSpeedCPUAdam replaces it when the optimizer is offloaded
        "use_liger_kernel": t.liger_kernel,
        "bf16": t.dtype == "bf16",
        "fp16": t.dtype == "fp16",
        "seed": seed,
        "data_seed": seed,
        "activation_checkpointing": t.activation_checkpointing,
        "activation_checkpointing_kwargs": {"use_reentrant": False} if t.activation_checkpointing else None,
        "use_cpu": not cuda,
        # the Trainer's NaN filter reads every micro batch's loss on the host (torch.isnan(...) in a condition): a
        # device sync in the middle of the step; the trainer reports the step's loss itself (sp_trainer.py)
        "logging_nan_inf_filter": False,
    }


def deepspeed_config_resolved(data: Any) -> dict:
    """The DeepSpeed config with nothing left to fill: `train_batch_size` is micro x accum x dp (DeepSpeed's
    data-parallel world is world / sp under Ulysses), so `deepspeed.initialize` / `DeepSpeedConfig` load it
    without the Transformers Trainer. The trainer itself uses `deepspeed_config` ("auto" filled by Transformers)."""
    spec = as_spec(data)
    t = spec.plan.training
    return {**deepspeed_config(spec), "train_batch_size": t.micro_batch_size * t.grad_accum * spec.dp}


# The exported files' names: the YAML, training_args.json and the zip refer to one another by them.
DEEPSPEED_JSON = "deepspeed_config.json"
TRAINING_ARGS_JSON = "training_args.json"
PLAN_JSON = "plan.json"
SBATCH_FILE = "ulab-job.sbatch"


def accelerate_config(data: Any, machine_rank: int = 0) -> dict:
    """An `accelerate launch --config_file` config equivalent to what the trainer sets up in code, for the node
    `machine_rank` (several nodes: one file per node; the main node's address comes on the command line,
    --main_process_ip, as the sbatch script passes it). No mixed_precision: the DeepSpeed JSON carries the precision,
    and `accelerate launch` counts a mixed_precision of the config file as a DeepSpeed field set beside
    deepspeed_config_file (accelerate/commands/launch.py `mp_from_config_flag`), which DeepSpeedPlugin then refuses
    (utils/dataclasses.py `_deepspeed_config_checks`) when the trainer builds its TrainingArguments."""
    spec = as_spec(data)
    t = spec.plan.training
    nnodes, _ = nodes_and_ranks_per_node(spec)
    par = parallelism(spec)
    # every DeepSpeed setting is in the exported JSON (DEEPSPEED_JSON): Accelerate reads that file, and refuses the
    # settings it would ignore beside it (accelerate/utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks)
    ds: dict[str, Any] = {"deepspeed_config_file": DEEPSPEED_JSON, "zero3_init_flag": t.zero_stage == 3}
    if nnodes > 1:
        ds["deepspeed_multinode_launcher"] = "standard"  # torchrun-style: one launch per node, no hostfile/pdsh
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": ds,
        "num_machines": nnodes,
        "num_processes": spec.world,
        "machine_rank": machine_rank,
        **({"main_process_port": RDZV_PORT} if nnodes > 1 else {}),
        "rdzv_backend": "c10d" if nnodes > 1 else "static",
        "same_network": True,
        "parallelism_config": {
            "parallelism_config_dp_shard_size": par["dp_shard_size"],
            "parallelism_config_sp_size": par["sp_size"],
            "parallelism_config_sp_backend": par["sp_backend"],
            "parallelism_config_sp_seq_length_is_variable": par["sp_seq_length_is_variable"],
            "parallelism_config_sp_attn_implementation": par["sp_attn_implementation"],
        },
        "use_cpu": False,
    }


def accelerate_config_yaml(data: Any, machine_rank: int = 0) -> str:
    return yaml.safe_dump(accelerate_config(data, machine_rank), sort_keys=False)


# How torchrun marks each line a rank writes when it tees the ranks' output (`rank_logs`): with the global rank, so one
# log of the node tells the ranks apart (backend/core/logs.RANK_LINE reads it back). torchrun reads the template from
# this environment variable (torch/distributed/run.py).
RANK_PREFIX_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
RANK_PREFIX = "[rank${rank}]: "


# How long torchrun lets the ranks save after SIGTERM before it SIGKILLs them. It goes in the environment, not in
# the argument list: torch 2.13's torchrun takes `--shutdown-timeout` or this variable
# (torch/distributed/launcher/api.py), but torch 2.11's has no such option and exits 2 at "unrecognized arguments:
# --shutdown-timeout" (seen on the H100 check, bench/results/logs/gpu-h100-2026-11-27-check-2.log), while an unknown
# variable is ignored. A torchrun that does not read it gives the ranks its fixed 30 s (MIN_STOP_GRACE_S).
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def torchrun_env(shutdown_timeout: float) -> dict[str, str]:
    """The environment torchrun needs besides its argument list: the ranks' save grace (stop_grace_s), whole
    seconds rounded up."""
    return {SHUTDOWN_TIMEOUT_ENV: str(int(math.ceil(shutdown_timeout)))}


def torchrun_reads_shutdown_timeout() -> bool | None:
    """Whether this machine's torch reads SHUTDOWN_TIMEOUT_ENV (None: torch is not installed here). Read from the
    launcher's source without importing torch, which the process that starts torchrun never needs."""
    import importlib.util

    found = importlib.util.find_spec("torch")
    if found is None or not found.submodule_search_locations:
        return None
    source = Path(list(found.submodule_search_locations)[0]) / "distributed" / "launcher" / "api.py"
    try:
        return SHUTDOWN_TIMEOUT_ENV in source.read_text(errors="replace")
    except OSError:
        return None


# The rank's entry point: what torchrun and `accelerate launch` start on every rank (worker/trainer/rank.py).
RANK_MODULE = "worker.trainer.rank"


def torchrun_command(
    plan_path: str | Path,
    run_dir: str | Path,
    *,
    resume: bool = False,
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    python: str = sys.executable,
    rank_logs: str | Path | None = None,
) -> list[str]:
    """The argument list that starts the trainer's ranks on this node (never a shell string).

    One node: `--standalone` (a private c10d store on a free local port, so concurrent runs never collide).
    Several nodes: c10d rendezvous at `rdzv_endpoint` (host:port) under `rdzv_id`; every node runs the same
    list with its own `node_rank`. c10d assigns the global ranks; node_rank is passed for logs and for
    the static fallback only. How long torchrun lets the ranks save after SIGTERM is not in this list: it goes in
    the environment (`torchrun_env`), which every torch reads or ignores. `rank_logs`: a
    directory for each rank's own stdout/stderr files, whose lines torchrun also prints with RANK_PREFIX (when
    RANK_PREFIX_ENV holds it).
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
    if rank_logs is not None:  # each rank's stdout and stderr in files under it, and on torchrun's with RANK_PREFIX
        cmd += ["--tee", "3", "--log-dir", str(Path(rank_logs))]
    cmd += ["--max-restarts", "0", "-m", RANK_MODULE, "--plan", str(Path(plan_path)), "--run-dir",
            str(Path(run_dir))]
    if resume:
        cmd.append("--resume")
    return cmd


def attention_that_runs(plan: Plan, cuda: bool, installed: list[str] | None = None) -> dict:
    """Which attention kernel a run of this plan actually runs on a machine: the plan's on CUDA when that machine
    has it (`installed`: capabilities.py; None: not known), sdpa on CPU ranks; None when the run would
    fail at model load (a flash kernel that is not installed)."""
    asked = plan.training.attn_implementation
    runs = effective_attn(plan, cuda)
    if not cuda and asked != runs:
        note = f"{asked} needs CUDA: these CPU ranks run {runs}"
    elif installed is not None and runs not in installed:
        return {"requested": asked, "runs": None,
                "note": f"{asked} is not installed here (this machine has {', '.join(installed)}): the run would fail "
                        "when the model loads"}
    else:
        note = f"{runs} as planned"
    return {"requested": asked, "runs": runs, "note": note}


def dry_run(data: Any, cuda: bool, installed: list[str] | None = None) -> dict:
    """What `ulab train --dry-run` prints: the defaulted plan and the settings it turns into on this machine
    (`cuda` False: CPU ranks, gloo, sdpa), with the attention kernel that will actually run (`installed`: the
    kernels this machine has). Raises ValueError naming the first broken field."""
    spec = as_spec(data)
    plan = spec.plan
    stages = plan.stages() or [StagePlan(seq_len=plan.training.seq_len, steps=0, learning_rate=0.0,
                                         warmup_steps=0, lr_scheduler="constant")]
    first = stages[0]
    return {"plan": plan.effective(), "device": "cuda" if cuda else "cpu",
            "attention": attention_that_runs(plan, cuda, installed), "deepspeed": deepspeed_config(spec),
            "parallelism": parallelism(spec, first.seq_len, cuda),
            "training_args": training_arguments(plan, first, cuda), "stop_grace_s": stop_grace_s(spec),
            "stages": [s.model_dump() for s in plan.stages()]}


# PyTorch reads its CUDA caching allocator's settings from this variable once, at the first CUDA allocation
# (c10/cuda/CUDAAllocatorConfig): the trainer sets it in every process before that
# (worker/trainer/preflight.py set_alloc_conf).
ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf(data: Any, current: str | None) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF for the ranks: `training.expandable_segments` adds (or turns on)
    `expandable_segments:True` in whatever the environment already holds; otherwise the environment's own value."""
    if not as_spec(data).plan.training.expandable_segments:
        return current
    keep = [p for p in (current or "").split(",") if p.strip() and p.split(":")[0].strip() != "expandable_segments"]
    return ",".join(keep + ["expandable_segments:True"])
