"""The sbatch script of a Slurm run, rendered from slurm_job.sh.template. The template has `{{name}}` slots; the
values are integers, Slurm option values that must match a strict pattern (partition, account, QOS, time
limit), or paths quoted with shlex.quote. Nothing the user typed (run name, data path) is in the script: the job
reads its plan from the plan file, and the plan file's path is the only path of the run on its command line."""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).with_name("slurm_job.sh.template")
SLOT = re.compile(r"\{\{(\w+)\}\}")
# What Slurm accepts for partition/account/QOS names in practice, and no shell or sbatch-parser meta characters.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
# --time: minutes, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME = re.compile(r"^(\d{1,5}|\d{1,5}:\d{1,2}|\d{1,5}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2})$")


def check_name(value: str, field: str) -> str:
    if value and not NAME.match(value):
        raise ValueError(f"{field}: {value[:80]!r} is not a Slurm name (letters, digits, _ . + -; at most 64)")
    return value


def check_time(value: str, field: str) -> str:
    if value and not TIME.match(value):
        raise ValueError(f"{field}: {value[:80]!r} is not a Slurm time limit (minutes, H:M:S or D-H:M:S)")
    return value


@dataclass(frozen=True)
class JobRequest:
    """Everything the script says. `gpus_per_node` 0 asks for no GPUs (a CPU partition without GRES)."""
    run_id: int
    attempt: int
    nodes: int
    gpus_per_node: int
    grace_s: int
    plan: Path
    ulab: str
    partition: str = ""
    account: str = ""
    qos: str = ""
    time_limit: str = ""
    resume_from: str = ""  # "resume from here": stage<i>/checkpoint-<step> (CHECKPOINT_REF), else empty


def resource_lines(req: JobRequest) -> list[str]:
    lines = []
    if req.gpus_per_node > 0:  # without GRES on the node, asking for GPUs would keep the job pending forever
        lines.append(f"#SBATCH --gpus-per-node={int(req.gpus_per_node)}")
    for option, value, check in (("partition", req.partition, check_name), ("account", req.account, check_name),
                                 ("qos", req.qos, check_name), ("time", req.time_limit, check_time)):
        if value:
            lines.append(f"#SBATCH --{option}={check(value, f'slurm {option}')}")
    return lines


# The form of a checkpoint reference (worker/trainer/checkpoints.CHECKPOINT_REF): nothing else reaches the script.
CHECKPOINT_REF = re.compile(r"^stage\d{1,4}/checkpoint-\d{1,12}$")


def render(req: JobRequest) -> str:
    for field in ("run_id", "attempt", "nodes", "gpus_per_node", "grace_s"):
        value = getattr(req, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{field}: {value!r} is not a whole number")
    if req.nodes < 1:
        raise ValueError(f"nodes: {req.nodes} (at least 1)")
    if req.resume_from and not CHECKPOINT_REF.match(req.resume_from):
        raise ValueError(f"resume_from: {req.resume_from[:80]!r} is not stage<i>/checkpoint-<step>")
    values = {"resume_line": f"export ULAB_RESUME_FROM={req.resume_from}" if req.resume_from else "",
              "run_id": str(req.run_id), "attempt": str(req.attempt), "nodes": str(req.nodes),
              "grace_s": str(min(req.grace_s, 65535)), "resource_lines": "\n".join(resource_lines(req)),
              "ulab": shlex.quote(req.ulab), "plan": shlex.quote(str(req.plan))}
    return SLOT.sub(lambda m: values[m.group(1)], TEMPLATE.read_text())
