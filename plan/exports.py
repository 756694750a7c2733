"""What a plan turns into for a user to run it without the service: the files of the export (plan.json with its run
section, the DeepSpeed JSON, training_args.json, one Accelerate YAML and one torchrun line per node, the sbatch script
and a README), built from the very functions the trainer runs with (plan/launch.py). On a cluster node the trainer
installs as `pip install 'ulysses-lab[trainer]'` (or the project's wheel with that extra), and the torchrun lines
the sbatch script start `ulab train`'s launcher, `python -m worker.trainer`, and it starts each rank as
`python -m worker.trainer.rank` (the torchrun lines and `accelerate launch` start the rank module directly).

Pure functions (no torch).
"""
from __future__ import annotations

import json
import math
import shlex
from typing import Any

from .launch import (
    DATA_PATH_ENV,
    DEEPSPEED_JSON,
    MAIN_NODE_ENV,
    MAIN_NODE_PORT,
    PLAN_JSON,
    RANK_MODULE,
    RDZV_PORT,
    SBATCH_FILE,
    TRAINING_ARGS_JSON,
    accelerate_config_yaml,
    as_spec,
    deepspeed_config,
    deepspeed_config_resolved,
    kernel_packages,
    launcher_stop_wait_s,
    nodes_and_ranks_per_node,
    parallelism,
    stop_grace_s,
    torchrun_command,
    torchrun_env,
    training_arguments,
)
from .model import StagePlan
from .validation import Spec, validate

# What a cluster node installs to run the exports (pyproject's `trainer` extra)
TRAINER_INSTALL = "pip install 'ulysses-lab[trainer]'"
TRAINER_WHEEL_INSTALL = 'pip install "$(ls ulysses_lab-*.whl)[trainer]"'


def launch_command(spec: Spec, node_rank: int = 0) -> str:
    """The torchrun line a user pastes on node `node_rank` (multi-node: $MAIN_NODE_IP, exported once on every
    node, is the address of node 0)."""
    nnodes, per_node = nodes_and_ranks_per_node(spec)
    cmd = torchrun_command("plan.json", "runs/my-run", nproc_per_node=per_node, nnodes=nnodes, node_rank=node_rank,
                           rdzv_endpoint=f"${MAIN_NODE_ENV}:${{{MAIN_NODE_PORT}:-{RDZV_PORT}}}"
                           if nnodes > 1 else None, python="python")
    env = " ".join(f"{k}={v}" for k, v in torchrun_env(stop_grace_s(spec)).items())
    command = env + " " + " ".join(f'"{a}"' if a.startswith("$") else shlex.quote(a) for a in cmd)
    if nnodes > 1:
        command += f"  # node {node_rank} of {nnodes}"
    return command


# The sbatch script's SIGTERM comes this long before the time limit: the stop's own wait (launcher_stop_wait_s) and
# a margin for srun to pass the signal on and for the job to end before Slurm's KillWait.
SBATCH_SIGNAL_MARGIN_S = 30


def kernels_line(spec: Spec) -> str:
    """What a GPU node must have installed for this plan's kernels, in words (the sbatch script and the README)."""
    needed = kernel_packages(spec.plan)
    if not needed:
        return "no kernel package beyond the trainer's install"
    return ", ".join(needed) + " (must be installed on every node, built for its torch and CUDA; the trainer stops " \
                               "before its ranks start without it)"


def sbatch_script(spec: Spec) -> str:
    """A batch script that runs the plan on a Slurm cluster without the Ulysses Lab service: `sbatch` it beside
    plan.json, unedited. One task per node starts that node's ranks: `python -m worker.trainer` (as `ulab train`,
    with torchrun), or `accelerate launch` with the node's Accelerate YAML (ULAB_LAUNCHER=accelerate); the nodes
    meet at c10d rendezvous on the job's first node, which the script reads from SLURM_JOB_NODELIST. --resume (from
    step 1 without a checkpoint) and --requeue let a preempted or requeued job continue from its newest checkpoint.
    Partition, account and time limit are the cluster's to say: on sbatch's command line or as #SBATCH lines; the
    data path, the plan, the run directory and the launcher are environment variables with the plan's defaults."""
    nnodes, per_node = nodes_and_ranks_per_node(spec)
    plan = spec.plan
    signal_s = int(math.ceil(launcher_stop_wait_s(spec))) + SBATCH_SIGNAL_MARGIN_S
    what = (f"{plan.parallel.sp_size} x {plan.parallel.dp_size} (sp x dp) on {nnodes} node(s) x {per_node} GPUs, "
            f"seq_len {plan.training.seq_len}, {plan.total_steps() or '?'} steps")
    data = plan.run.data.path if plan.run is not None else ""
    return f"""#!/bin/bash
# Ulysses Lab: {what}.
# Every node: {TRAINER_INSTALL}   (or the project's wheel: {TRAINER_WHEEL_INSTALL})
# Kernels: {kernels_line(spec)}.
# Submit from the directory that holds plan.json (the planner's plan download), on a file system every node sees:
#   sbatch --partition=... --account=... --time=... ulab-job.sbatch
# Settings, from the submitting shell's environment (sbatch passes it on), else the defaults below:
#   {DATA_PATH_ENV}   the training data (a relative path is read from plan.json's directory)
#   ULAB_PLAN, ULAB_RUN_DIR   the plan file and the run directory (checkpoints, metrics.jsonl, logs)
#   ULAB_LAUNCHER    ulab (python -m worker.trainer starts torchrun) or accelerate (accelerate launch with
#                    accelerate_config_node<N>.yaml on node N)
#   {MAIN_NODE_PORT}   the rendezvous port on the job's first node
#SBATCH --job-name=ulysses-lab
#SBATCH --nodes={nnodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={per_node}
# SIGTERM {signal_s} s before the time limit: the trainer saves a checkpoint (run.stop_grace_s) and stops
#SBATCH --signal=B:TERM@{signal_s}
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=ulab-%j.log
set -u
export {DATA_PATH_ENV}="${{{DATA_PATH_ENV}:-{shlex.quote(data)}}}"
export ULAB_PLAN="${{ULAB_PLAN:-plan.json}}"
export ULAB_RUN_DIR="${{ULAB_RUN_DIR:-runs/ulysses-lab-$SLURM_JOB_ID}}"
launcher="${{ULAB_LAUNCHER:-ulab}}"
# the job's first node hosts the rendezvous
export ULAB_MAIN_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export ULAB_MAIN_PORT="${{{MAIN_NODE_PORT}:-{RDZV_PORT}}}"
export ULAB_RDZV_ENDPOINT="$ULAB_MAIN_NODE:$ULAB_MAIN_PORT"
export ULAB_RDZV_ID="slurm-$SLURM_JOB_ID"
# one task per node: its task id is its node rank (also when a test cluster runs the nodes' tasks on one machine)
case "$launcher" in
  ulab) node_command='ULAB_NODE_RANK=$SLURM_PROCID exec python -m worker.trainer --plan "$ULAB_PLAN" \
--run-dir "$ULAB_RUN_DIR" --resume' ;;
  accelerate) node_command='exec accelerate launch --config_file "accelerate_config_node$SLURM_PROCID.yaml" \
--machine_rank "$SLURM_PROCID" --main_process_ip "$ULAB_MAIN_NODE" --main_process_port "$ULAB_MAIN_PORT" \
-m {RANK_MODULE} --plan "$ULAB_PLAN" --run-dir "$ULAB_RUN_DIR" --resume' ;;
  *) echo "unknown launcher $launcher (ulab or accelerate)" >&2; exit 2 ;;
esac
echo "--- slurm job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST, $launcher ---"
srun --kill-on-bad-exit=1 bash -c "$node_command" &
srun_pid=$!
trap 'kill -TERM "$srun_pid" 2>/dev/null' TERM
# `wait` returns early (above 128) when the trap runs: wait on until srun itself has ended
wait "$srun_pid"
code=$?
while kill -0 "$srun_pid" 2>/dev/null; do
  wait "$srun_pid"
  code=$?
done
exit "$code"
"""


def training_args_export(spec: Spec) -> dict:
    """training_args.json: what a user's own script passes to Transformers and Accelerate to train as the estimate
    assumes. `training_arguments`: `TrainingArguments(**...)` fields (the first stage's; `deepspeed` names the
    exported JSON). `parallelism_config` / `sp_handler`: Accelerate's `ParallelismConfig(**...,
    sp_handler=DeepSpeedSequenceParallelConfig(**...))`. `alst`: the switches the estimate counts that no library
    option sets, with the DeepSpeed class that implements each (worker/trainer/modeling.py applies them)."""
    plan = spec.plan
    stages = plan.stages() or [StagePlan(seq_len=plan.training.seq_len, steps=1, learning_rate=1e-4,
                                         warmup_steps=0, lr_scheduler="constant")]
    first = stages[0]
    par = parallelism(spec, first.seq_len)
    t = plan.training
    return {
        "training_arguments": {"output_dir": "runs/my-run", "deepspeed": DEEPSPEED_JSON,
                               **training_arguments(plan, first, cuda=True)},
        "parallelism_config": {k: par[k] for k in ("sp_backend", "sp_size", "dp_shard_size")},
        "sp_handler": {k: par[k] for k in ("sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")},
        "alst": {
            "tiled_mlp": {"enabled": t.tiled_mlp,
                          "implementation": "deepspeed.runtime.sequence_parallel.ulysses_sp.TiledMLP"},
            "tiled_logits_loss": {"enabled": t.tiled_logits_loss,
                                  "implementation": "deepspeed.runtime.sequence_parallel.ulysses_sp."
                                                    "TiledFusedLogitsLoss"},
            "checkpoint_offload": {"enabled": t.checkpoint_offload,
                                   "implementation": "deepspeed.runtime.activation_checkpointing."
                                                     "offload_activations.CheckpointHiddenStatesOffload"},
        },
        "stages": [st.model_dump() for st in stages],
    }


def export_files(data: Any) -> dict[str, str]:
    """Every file a plan's run needs, by name, for every node: what the zip download holds. ValueError naming the
    first broken field for an invalid plan."""
    spec = as_spec(data)
    x = exports(spec.plan)
    files = {PLAN_JSON: x["plan_json"], DEEPSPEED_JSON: x["deepspeed_json"],
             TRAINING_ARGS_JSON: x["training_args_json"], SBATCH_FILE: x["sbatch_script"]}
    for n, (yml, line) in enumerate(zip(x["accelerate_yaml_per_node"], x["launch_commands_per_node"], strict=True)):
        files[f"accelerate_config_node{n}.yaml"] = yml
        files[f"launch_node{n}.sh"] = launch_script(spec, n, line)
    files["README.txt"] = export_readme(spec, sorted(files))
    return files


def launch_script(spec: Spec, node_rank: int, line: str) -> str:
    """launch_node<N>.sh: the node's torchrun line; several nodes: it stops at once, saying so, while the main
    node's address is not in the environment."""
    need = (f': "${{{MAIN_NODE_ENV}:?is not set: export it on every node, the address of node 0}}"\n'
            if spec.num_nodes > 1 else "")
    return f"#!/bin/bash\n# node {node_rank}: run from the directory that holds plan.json\n{need}{line}\n"


def export_readme(spec: Spec, names: list[str]) -> str:
    nnodes = spec.num_nodes
    node = (f"Several nodes by hand: export {MAIN_NODE_ENV} (the address of node 0) on every node, and "
            f"{MAIN_NODE_PORT} when {RDZV_PORT} is taken, then run launch_node<N>.sh on node N.\n"
            if nnodes > 1 else "One node: run launch_node0.sh.\n")
    return ("Ulysses Lab exports of one plan. Install the trainer on every node (no checkout needed):\n"
            f"  {TRAINER_INSTALL}   # or the project's wheel: {TRAINER_WHEEL_INSTALL}\n"
            f"Kernels: {kernels_line(spec)}.\n"
            f"Data: plan.json's run.data.path, or the file or directory {DATA_PATH_ENV} names.\n"
            "Then, in this directory:\n" + node +
            "On Slurm: sbatch --partition=... ulab-job.sbatch (from this directory, on a file system every node "
            "sees); it finds the main node itself. ULAB_LAUNCHER=accelerate starts each node with accelerate launch "
            "and its accelerate_config_node<N>.yaml instead of torchrun.\n"
            "Your own script: deepspeed_config.json (DeepSpeed), training_args.json (TrainingArguments, "
            "ParallelismConfig), accelerate_config_node<N>.yaml (accelerate launch --config_file, with "
            "--main_process_ip on several nodes).\n\nFiles: " + ", ".join(names) + "\n")


def exports(data: Any) -> dict:
    """The files and lines a plan turns into, ready to paste (plan.results.Exports); an invalid plan answers
    `{"valid": false, "errors": [...]}`. `deepspeed_json` has every value resolved; `deepspeed_json_hf_trainer`
    keeps "auto" for the Transformers Trainer to fill. Several nodes: one Accelerate YAML and one torchrun line
    per node. `sbatch_script` runs the plan on a Slurm cluster by hand (sbatch_script)."""
    v = validate(data)
    if v.spec is None:
        return {"valid": False, "errors": v.errors}
    nodes = range(v.spec.num_nodes)
    return {"valid": True, "errors": [], "accelerate_yaml": accelerate_config_yaml(v.spec),
            "deepspeed_json": json.dumps(deepspeed_config_resolved(v.spec), indent=2) + "\n",
            "deepspeed_json_hf_trainer": json.dumps(deepspeed_config(v.spec), indent=2) + "\n",
            "launch_command": launch_command(v.spec),
            "accelerate_yaml_per_node": [accelerate_config_yaml(v.spec, n) for n in nodes],
            "launch_commands_per_node": [launch_command(v.spec, n) for n in nodes],
            "plan_json": json.dumps(v.spec.plan.effective(), indent=2) + "\n",
            "training_args_json": json.dumps(training_args_export(v.spec), indent=2) + "\n",
            "sbatch_script": sbatch_script(v.spec)}
