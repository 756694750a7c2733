"""The run a plan asks for, validated once, up front (torchtitan's parallel_dims idea): `RunSpec.from_plan`.

Pure Python, no torch: the CLI validates a plan before any rank starts, and errors name the field to change.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

ATTN_IMPLEMENTATIONS = {"sdpa", "flash_attention_2", "flash_attention_3", "flex_attention"}
DTYPES = {"fp32", "bf16", "fp16"}


class PlanError(ValueError):
    """A plan the trainer cannot run; the message names the field."""


@dataclass(frozen=True)
class Stage:
    seq_len: int
    steps: int
    learning_rate: float
    warmup_steps: int = 0
    lr_scheduler: str = "constant"


@dataclass(frozen=True)
class RunSpec:
    sp_size: int
    dp_size: int
    num_nodes: int
    micro_batch_size: int
    grad_accum: int
    dtype: str
    zero_stage: int
    offload_optimizer: bool
    offload_params: bool
    activation_checkpointing: bool
    checkpoint_offload: bool
    tiled_mlp: bool
    tiled_logits_loss: bool
    attn_implementation: str
    stages: tuple[Stage, ...]
    seed: int
    data: dict
    model_config: dict | None
    model_path: str | None
    checkpoint_every: int
    keep_checkpoints: int
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    plan: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def world_size(self) -> int:
        return self.sp_size * self.dp_size

    @property
    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages)

    def stage_at(self, global_step: int) -> tuple[int, int]:
        """(stage index, steps already done inside it) for a run that has finished `global_step` steps."""
        done = 0
        for i, s in enumerate(self.stages):
            if global_step < done + s.steps:
                return i, global_step - done
            done += s.steps
        return len(self.stages), 0

    @classmethod
    def from_plan(cls, plan: dict) -> "RunSpec":
        return _parse(plan)


def load_plan(path: Path) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise PlanError(f"plan {path}: cannot read: {e.strerror or e}")
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as e:
        raise PlanError(f"plan {path}: not valid JSON: {e}")
    if not isinstance(plan, dict):
        raise PlanError(f"plan {path}: must be a JSON object")
    return plan


def _int(section: dict, key: str, where: str, default=None, minimum: int = 1) -> int:
    v = section.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int):
        raise PlanError(f"{where}.{key}: must be an integer, got {v!r}")
    if v < minimum:
        raise PlanError(f"{where}.{key}: must be at least {minimum}, got {v}")
    return v


def _float(section: dict, key: str, where: str, default=None) -> float:
    v = section.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise PlanError(f"{where}.{key}: must be a number, got {v!r}")
    return float(v)


def _parse(plan: dict) -> RunSpec:
    par = plan.get("parallel") or {}
    hw = plan.get("hardware") or {}
    tr = plan.get("training")
    run = plan.get("run")
    if not isinstance(tr, dict):
        raise PlanError("training: missing (plan-v1 needs a training section)")
    if not isinstance(run, dict):
        raise PlanError("run: missing (trainer-v1 needs a run section with steps, learning_rate and data)")
    sp = _int(par, "sp_size", "parallel", 1)
    dp = _int(par, "dp_size", "parallel", 1)
    nnodes = _int(hw, "num_nodes", "hardware", 1)
    gpn = hw.get("gpus_per_node")
    if gpn is not None and (not isinstance(gpn, int) or gpn * nnodes != sp * dp):
        raise PlanError(f"hardware.gpus_per_node: world size sp_size*dp_size={sp * dp} must equal "
                        f"gpus_per_node*num_nodes={gpn}*{nnodes}")
    if (sp * dp) % nnodes:
        raise PlanError(f"hardware.num_nodes: {nnodes} nodes cannot split a world of {sp * dp} ranks evenly")
    dtype = tr.get("dtype", "bf16")
    if dtype not in DTYPES:
        raise PlanError(f"training.dtype: must be one of {sorted(DTYPES)}, got {dtype!r}")
    attn = tr.get("attn_implementation", "sdpa")
    if attn not in ATTN_IMPLEMENTATIONS:
        raise PlanError(f"training.attn_implementation: must be one of {sorted(ATTN_IMPLEMENTATIONS)}, got {attn!r}"
                        + (" (eager materializes a 4D mask; Ulysses SP refuses it)" if attn == "eager" else ""))
    zero = _int(tr, "zero_stage", "training", 2, minimum=0)
    if zero > 3:
        raise PlanError(f"training.zero_stage: must be 0, 1, 2 or 3, got {zero}")
    if tr.get("offload_params") and zero != 3:
        raise PlanError("training.offload_params: parameter offload needs zero_stage 3")

    # model: a local checkpoint / hub id, or an architecture built with random weights
    model_path = run.get("model_path")
    model = plan.get("model") or {}
    model_config = model.get("config") if isinstance(model, dict) else None
    if model_path is None and not isinstance(model_config, dict):
        raise PlanError("run.model_path: null needs model.config (an architecture to build with random weights)")
    if model_config is not None:
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
            if not isinstance(model_config.get(k), int) or model_config[k] < 1:
                raise PlanError(f"model.config.{k}: must be a positive integer")
        heads = model_config["num_attention_heads"]
        kv = model_config.get("num_key_value_heads", heads)
        if heads % sp:
            raise PlanError(f"parallel.sp_size: num_attention_heads ({heads}) is not divisible by sp_size ({sp})")
        if kv % sp and sp % kv:
            raise PlanError(f"parallel.sp_size: num_key_value_heads ({kv}) and sp_size ({sp}) must divide one another")
        if model_path is None and model_config["vocab_size"] < 259:
            raise PlanError("model.config.vocab_size: the built-in byte tokenizer needs at least 259 tokens")

    # stages: an explicit list, or one stage from training.seq_len and run.steps
    lr = _float(run, "learning_rate", "run", 1e-4)
    warmup = _int(run, "warmup_steps", "run", 0, minimum=0)
    sched = run.get("lr_scheduler", "constant")
    raw = run.get("stages")
    if raw is None:
        raw = [{"seq_len": tr.get("seq_len"), "steps": run.get("steps")}]
        where = ["training", "run"]
    elif not isinstance(raw, list) or not raw:
        raise PlanError("run.stages: must be a non-empty list of {seq_len, steps}")
    else:
        where = None
    stages = []
    for i, st in enumerate(raw):
        w_seq, w_steps = (where if where else [f"run.stages[{i}]"] * 2)
        if not isinstance(st, dict):
            raise PlanError(f"run.stages[{i}]: must be an object with seq_len and steps")
        seq = _int(st, "seq_len", w_seq, minimum=2)
        steps = _int(st, "steps", w_steps)
        if seq % sp:
            raise PlanError(f"{w_seq}.seq_len: {seq} is not divisible by sp_size ({sp})")
        stages.append(Stage(seq_len=seq, steps=steps,
                            learning_rate=_float(st, "learning_rate", f"run.stages[{i}]", lr),
                            warmup_steps=_int(st, "warmup_steps", f"run.stages[{i}]", warmup, minimum=0),
                            lr_scheduler=st.get("lr_scheduler", sched)))
    for i, st in enumerate(stages):
        if st.lr_scheduler not in {"constant", "linear", "cosine"}:
            raise PlanError(f"run.stages[{i}].lr_scheduler: must be constant, linear or cosine")

    data = run.get("data")
    if not isinstance(data, dict) or not data.get("path"):
        raise PlanError("run.data.path: missing (a text, JSONL or Parquet file, or a saved datasets directory)")
    return RunSpec(
        sp_size=sp, dp_size=dp, num_nodes=nnodes,
        micro_batch_size=_int(tr, "micro_batch_size", "training", 1),
        grad_accum=_int(tr, "grad_accum", "training", 1),
        dtype=dtype, zero_stage=zero,
        offload_optimizer=bool(tr.get("offload_optimizer", False)),
        offload_params=bool(tr.get("offload_params", False)),
        activation_checkpointing=bool(tr.get("activation_checkpointing", False)),
        checkpoint_offload=bool(tr.get("checkpoint_offload", False)),
        tiled_mlp=bool(tr.get("tiled_mlp", False)),
        tiled_logits_loss=bool(tr.get("tiled_logits_loss", False)),
        attn_implementation=attn,
        stages=tuple(stages),
        seed=_int(run, "seed", "run", 0, minimum=0),
        data=dict(data),
        model_config=model_config,
        model_path=model_path,
        checkpoint_every=_int(run, "checkpoint_every", "run", 0, minimum=0),
        keep_checkpoints=_int(run, "keep_checkpoints", "run", 2),
        weight_decay=_float(run, "weight_decay", "run", 0.0),
        max_grad_norm=_float(tr, "max_grad_norm", "training", 1.0),
        plan=plan,
    )
