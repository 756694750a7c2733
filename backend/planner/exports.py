"""Launch files for a plan: the same DeepSpeed config, Accelerate YAML and torchrun command the trainer uses."""
from __future__ import annotations

import json
import shlex

from .validate import parse


def exports(plan) -> dict:
    """`{"accelerate_yaml": str, "deepspeed_json": str, "launch_command": str}` for a plan, ready to copy.

    Built by worker/trainer/launch_config.py (imported lazily: it is pure, but it belongs to the trainer), so what
    a user copies is exactly what `ulab train` runs. An invalid plan answers `{"valid": false, "errors": [...]}`.
    """
    spec, errors, _ = parse(plan)
    if spec is None:
        return {"valid": False, "errors": errors}
    from worker.trainer import launch_config as lc

    nnodes, per_node = lc.nodes_and_ranks_per_node(plan)
    cmd = lc.torchrun_command("plan.json", "runs/my-run", nproc_per_node=per_node, nnodes=nnodes,
                              rdzv_endpoint="$MASTER_ADDR:29500" if nnodes > 1 else None, python="python")
    command = " ".join(a if a.startswith("$") else shlex.quote(a) for a in cmd)
    if nnodes > 1:
        command = command.replace("'$MASTER_ADDR:29500'", "$MASTER_ADDR:29500")
        command += "  # run on every node with --node-rank set to that node's index"
    return {"valid": True, "accelerate_yaml": lc.accelerate_config_yaml(plan),
            "deepspeed_json": json.dumps(lc.deepspeed_config(plan), indent=2) + "\n", "launch_command": command}
