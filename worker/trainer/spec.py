"""The run a plan asks for, validated once, up front, by the plan model (`plan`): `RunSpec.from_plan`.

Pure Python, no torch: the CLI validates a plan before any rank starts. The fields, defaults and rules are the
plan model's (plan/model.py, plan/rules.py); this module only adds the trainer's view of them (names the
training code reads, the stage bookkeeping of progressive extension).
"""
from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plan import Plan, Spec, validate
from plan.errors import first_line
from plan.launch import ATTENTION_PACKAGES, DATA_PATH_ENV
from plan.model import TOKENIZER_FILES, StagePlan, Training
from plan.training_fields import TrainingFields


class PlanError(ValueError):
    """A plan the trainer cannot run; the message names the field first (`training.seq_len: ...`)."""


@dataclass(frozen=True)
class RunSpec(TrainingFields):
    """A valid plan with a `run` section. Training fields read through to the plan (`spec.zero_stage`)."""

    spec: Spec
    stages: tuple[StagePlan, ...]

    @classmethod
    def from_plan(cls, data: Any) -> RunSpec:
        if isinstance(data, dict) and not isinstance(data.get("run"), dict):
            raise PlanError("run: missing (trainer-v1 needs a run section with steps, learning_rate and data)")
        v = validate(data)
        if v.spec is None:
            raise PlanError(first_line(v.errors))
        return cls(spec=v.spec, stages=tuple(v.spec.plan.stages()))

    @property
    def depends_on_device(self) -> bool:
        """Whether `check_device` has anything to check for this plan."""
        return (self.liger_kernel or (self.sp_size > 1 and self.attn_implementation == "flex_attention")
                or self.attn_implementation in ATTENTION_PACKAGES)

    def check_device(self, cuda: bool) -> None:
        """Rules that depend on the machine the ranks run on (the plan itself stays valid for a GPU); PlanError
        naming the field, before any rank starts."""
        if self.liger_kernel and not cuda:
            raise PlanError("training.liger_kernel: Liger's kernels are Triton kernels and need a CUDA device; this "
                            "machine has none (set it to false for a CPU run)")
        self.check_attention(cuda)
        if cuda and self.sp_size > 1 and self.attn_implementation == "flex_attention":
            raise PlanError("training.attn_implementation: flex_attention under Ulysses (sp_size > 1) attends across "
                            "the packed documents' boundaries (DeepSpeed rebuilds a plain causal block mask); use "
                            "flash_attention_2 or sdpa")

    def check_attention(self, cuda: bool) -> None:
        """A flash-attention kernel the machine lacks fails here, naming the field, instead of with Transformers'
        ImportError once the ranks build the model. (CPU ranks run sdpa whatever the plan says: plan.launch
        effective_attn.)"""
        package = ATTENTION_PACKAGES.get(self.attn_implementation)
        if cuda and package and importlib.util.find_spec(package[0]) is None:
            raise PlanError(f"training.attn_implementation: {self.attn_implementation} needs the {package[1]} package, "
                            f"which this machine does not have (install it, or use sdpa)")

    @property
    def training_section(self) -> Training:  # its fields: zero_stage, tiled_mlp, dtype, ... (plan/training_fields.py)
        return self.spec.plan.training

    @property
    def plan(self) -> Plan:
        return self.spec.plan

    @property
    def run(self):
        assert self.spec.plan.run is not None  # from_plan refuses a plan without one
        return self.spec.plan.run

    @property
    def sp_size(self) -> int:
        return self.plan.parallel.sp_size

    @property
    def dp_size(self) -> int:
        return self.plan.parallel.dp_size

    @property
    def num_nodes(self) -> int:
        return self.plan.hardware.num_nodes

    @property
    def world_size(self) -> int:
        return self.plan.world_size

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def data(self) -> dict:
        return self.run.data.model_dump()

    @property
    def model_config(self) -> dict | None:
        return self.plan.model.config

    @property
    def model_path(self) -> str | None:
        """Where the weights load from: `run.model_path`; with none and `model.preset`, the preset's checkpoint
        (`preset_checkpoint`); None (random weights from `model.config`) otherwise."""
        if self.run.model_path is None and self.plan.model.preset is not None:
            return preset_checkpoint(self.plan.model.preset)
        return self.run.model_path

    @property
    def tokenizer_path(self) -> str | None:
        """Where the tokenizer loads from: `run.tokenizer`, else the checkpoint's; None: the byte tokenizer."""
        return self.run.tokenizer or self.model_path

    @property
    def checkpoint_every(self) -> int:
        return self.run.checkpoint_every

    @property
    def keep_checkpoints(self) -> int:
        return self.run.keep_checkpoints

    def stage_at(self, global_step: int) -> tuple[int, int]:
        """(stage index, steps already done inside it) for a run that has finished `global_step` steps."""
        done = 0
        for i, s in enumerate(self.stages):
            if global_step < done + s.steps:
                return i, global_step - done
            done += s.steps
        return len(self.stages), 0


# The models root the service checks at approval (backend/core/settings.py models_dir); a node started by hand reads
# the same variable. A preset whose directory is not under it loads as a hub id (Transformers' cache or the hub).
MODELS_DIR_ENV = "ULAB_MODELS_DIR"


def preset_checkpoint(preset: str) -> str:
    """The checkpoint of a preset with no `run.model_path`: ULAB_MODELS_DIR/<preset> when that directory exists, else
    the preset's name as a hub id."""
    root = os.environ.get(MODELS_DIR_ENV)
    if root and (Path(root).expanduser() / preset).is_dir():
        return str(Path(root).expanduser() / preset)
    return preset


def check_model_source(spec: RunSpec) -> None:
    """The checkpoint a run loads, checked where it is loaded, before any rank starts: a directory must hold a
    config.json; a hub id must be in Transformers' cache when the hub is off (HF_HUB_OFFLINE). PlanError naming
    run.model_path."""
    source = spec.model_path
    if source is None:
        return
    local = Path(source).expanduser()
    if local.is_absolute() or source.startswith(".") or local.exists():
        if not (local / "config.json").is_file():
            raise PlanError(f"run.model_path: {source} has no config.json (a directory saved with save_pretrained "
                            "or downloaded from the hub)")
        if spec.run.tokenizer is None and not any((local / f).is_file() for f in TOKENIZER_FILES):
            raise PlanError(f"run.model_path: {source} holds no tokenizer files (none of "
                            f"{', '.join(TOKENIZER_FILES)}); save the tokenizer beside the weights or name one in "
                            "run.tokenizer")
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(source, "config.json"), str):
            where = f"{os.environ.get(MODELS_DIR_ENV, '(ULAB_MODELS_DIR unset)')}/{source}"
            raise PlanError(f"run.model_path: {source} is not downloaded (looked in {where} and the Hugging Face "
                            "cache, with HF_HUB_OFFLINE set); download it or set run.model_path to its directory")


def load_plan(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PlanError(f"plan {path}: cannot read: {e.strerror or e}") from None
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"plan {path}: not valid JSON: {e}") from None
    if not isinstance(plan, dict):
        raise PlanError(f"plan {path}: must be a JSON object")
    data_path = os.environ.get(DATA_PATH_ENV)
    if data_path and isinstance(plan.get("run"), dict):  # an exported job's data (plan/launch.py DATA_PATH_ENV)
        data = plan["run"].get("data")
        plan["run"] = {**plan["run"], "data": {**(data if isinstance(data, dict) else {}), "path": data_path}}
    return plan
