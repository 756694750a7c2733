"""Plan parsing and constraints: a plan-v1 dict -> (Spec, errors, warnings).

Never raises for user input. Every error is `{"field": "section.key", "message": ...}` naming the field to
change, one per broken rule (torchtitan's parallel_dims.py style: validate the layout once, up front).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sys

from . import catalog as _catalog_module  # noqa: F401  (ensures the submodule is loaded)

cat = sys.modules[__package__ + ".catalog"]  # the module, not the package-level catalog() function

ATTN_IMPLEMENTATIONS = ("flash_attention_2", "flash_attention_3", "sdpa", "flex_attention", "eager")
# DeepSpeed's UlyssesSPAttentionHF.register_with_transformers rejects "eager" (ulysses_sp.py: it needs a
# causal kernel that takes no mask, the masks are discarded after the all-to-all).
ULYSSES_UNSUPPORTED_ATTN = ("eager",)
DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}
DEFAULT_CPU_GIB_PER_NODE = 1024.0

TRAINING_DEFAULTS = {
    "micro_batch_size": 1, "grad_accum": 1, "dtype": "bf16", "zero_stage": 3, "offload_optimizer": False,
    "offload_params": False, "activation_checkpointing": True, "checkpoint_offload": False, "tiled_mlp": False,
    "tiled_logits_loss": False, "attn_implementation": "flash_attention_2",
}


@dataclass(frozen=True)
class Spec:
    """A validated plan: everything the estimators read."""
    model: cat.ModelSpec
    gpu: cat.GpuSpec
    gpus_per_node: int
    num_nodes: int
    cpu_gib_per_node: float
    sp: int
    dp: int
    seq_len: int
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
    attn: str

    @property
    def world(self) -> int:
        return self.sp * self.dp

    @property
    def dtype_bytes(self) -> int:
        return DTYPES[self.dtype]

    @property
    def local_tokens(self) -> int:
        """Tokens one rank holds between the all-to-alls: its sequence shard times the micro batch."""
        return self.micro_batch_size * self.seq_len // self.sp

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.world // self.num_nodes)

    def with_(self, **changes) -> "Spec":
        return replace(self, **changes)


def _err(errors: list, field: str, message: str) -> None:
    errors.append({"field": field, "message": message})


def _int(errors, section: dict, name: str, field: str, default=None, minimum: int = 1):
    v = section.get(name)
    if v is None:
        v = default
    if v is None:
        _err(errors, field, f"{field} is required")
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
        _err(errors, field, f"{field} must be an integer, got {v!r}")
        return None
    if v < minimum:
        _err(errors, field, f"{field} must be at least {minimum}, got {int(v)}")
        return None
    return int(v)


def _bool(errors, section: dict, name: str, field: str, default: bool):
    v = section.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        _err(errors, field, f"{field} must be true or false, got {v!r}")
        return default
    return v


def _section(errors, plan: dict, name: str) -> dict:
    s = plan.get(name)
    if s is None:
        return {}
    if not isinstance(s, dict):
        _err(errors, name, f"{name} must be an object")
        return {}
    return s


def _model(errors, plan: dict):
    m = plan.get("model")
    if not isinstance(m, dict) or not ("preset" in m or "config" in m):
        _err(errors, "model", 'model must be {"preset": NAME} or {"config": {...Hugging Face config.json...}}')
        return None
    if "config" in m and m["config"] is not None:
        try:
            return cat.model_from_config(m["config"], name=str(m.get("preset") or "custom"))
        except ValueError as e:
            _err(errors, "model.config", str(e))
            return None
    name = m.get("preset")
    spec = cat.models().get(name) if isinstance(name, str) else None
    if spec is None:
        _err(errors, "model.preset", f"unknown model preset {name!r}; known presets: {', '.join(cat.models())} "
             "(or give model.config, any Hugging Face config.json)")
    return spec


def _gpu(errors, hw: dict):
    g = hw.get("gpu")
    if isinstance(g, dict):
        try:
            return cat.gpu_from_object(g)
        except ValueError as e:
            _err(errors, "hardware.gpu", str(e))
            return None
    spec = cat.gpus().get(g) if isinstance(g, str) else None
    if spec is None:
        what = "hardware.gpu is required" if g is None else f"unknown GPU {g!r}"
        _err(errors, "hardware.gpu", f"{what}; known GPUs: {', '.join(cat.gpus())} "
             "(or give an object with the columns name, " + ", ".join(cat.GPU_FIELDS) + ")")
    return spec


def parse(plan) -> tuple[Spec | None, list[dict], list[dict]]:
    """Validate a plan-v1 dict. Returns (spec or None, errors, warnings)."""
    errors: list[dict] = []
    warnings: list[dict] = []
    if not isinstance(plan, dict):
        return None, [{"field": "plan", "message": "a plan must be a JSON object (plan-v1)"}], warnings
    model = _model(errors, plan)
    hw = _section(errors, plan, "hardware")
    par = _section(errors, plan, "parallel")
    tr = _section(errors, plan, "training")
    gpu = _gpu(errors, hw)
    gpn = _int(errors, hw, "gpus_per_node", "hardware.gpus_per_node", default=1)
    nodes = _int(errors, hw, "num_nodes", "hardware.num_nodes", default=1)
    cpu_gib = hw.get("cpu_memory_gib_per_node")
    cpu_gib = DEFAULT_CPU_GIB_PER_NODE if cpu_gib is None else cpu_gib
    if isinstance(cpu_gib, bool) or not isinstance(cpu_gib, (int, float)) or cpu_gib <= 0:
        _err(errors, "hardware.cpu_memory_gib_per_node", f"must be a positive number, got {cpu_gib!r}")
        cpu_gib = DEFAULT_CPU_GIB_PER_NODE
    sp = _int(errors, par, "sp_size", "parallel.sp_size", default=1)
    dp = _int(errors, par, "dp_size", "parallel.dp_size", default=1)

    t = {**TRAINING_DEFAULTS, **{k: v for k, v in tr.items() if v is not None}}  # null means "default"
    seq = _int(errors, t, "seq_len", "training.seq_len")
    mbs = _int(errors, t, "micro_batch_size", "training.micro_batch_size")
    ga = _int(errors, t, "grad_accum", "training.grad_accum")
    stage = _int(errors, t, "zero_stage", "training.zero_stage", minimum=0)
    if stage is not None and stage > 3:
        _err(errors, "training.zero_stage", f"training.zero_stage must be 0, 1, 2 or 3, got {stage}")
        stage = None
    dtype = t.get("dtype")
    if dtype not in DTYPES:
        _err(errors, "training.dtype", f"training.dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    attn = t.get("attn_implementation")
    if attn not in ATTN_IMPLEMENTATIONS:
        _err(errors, "training.attn_implementation",
             f"training.attn_implementation must be one of {', '.join(ATTN_IMPLEMENTATIONS)}, got {attn!r}")
    flags = {k: _bool(errors, t, k, f"training.{k}", TRAINING_DEFAULTS[k]) for k in
             ("offload_optimizer", "offload_params", "activation_checkpointing", "checkpoint_offload", "tiled_mlp",
              "tiled_logits_loss")}

    # ---- cross-field rules -------------------------------------------------------------------------------
    if None not in (sp, dp, gpn, nodes) and sp * dp != gpn * nodes:
        _err(errors, "parallel.dp_size",
             f"sp_size x dp_size = {sp} x {dp} = {sp * dp} ranks, but the hardware has gpus_per_node x num_nodes = "
             f"{gpn} x {nodes} = {gpn * nodes} GPUs; make them equal")
    if seq is not None and sp is not None and seq % sp:
        _err(errors, "training.seq_len", f"seq_len ({seq}) is not divisible by sp_size ({sp}); "
             f"nearest multiples: {seq // sp * sp} or {(seq // sp + 1) * sp}")
    if model is not None and sp is not None:
        heads, kv = model.num_attention_heads, model.num_key_value_heads
        if sp > heads:
            _err(errors, "parallel.sp_size", f"sp_size ({sp}) exceeds num_attention_heads ({heads}): Ulysses gives "
                 "every rank at least one whole attention head")
        if heads % sp:
            _err(errors, "parallel.sp_size", f"num_attention_heads ({heads}) is not divisible by sp_size ({sp})")
        if kv % sp and sp % kv:
            _err(errors, "parallel.sp_size", f"num_key_value_heads ({kv}) and sp_size ({sp}) are incompatible: "
                 "one must divide the other (kv heads are split when kv % sp == 0, replicated when sp % kv == 0)")
        if seq is not None and model.max_position_embeddings and seq > model.max_position_embeddings:
            warnings.append({"field": "training.seq_len", "message":
                             f"seq_len ({seq}) exceeds the model's max_position_embeddings "
                             f"({model.max_position_embeddings}); use RoPE scaling (e.g. rope_scaling "
                             "{\"rope_type\": \"yarn\", \"factor\": "
                             f"{seq / model.max_position_embeddings:.1f}}}) or expect degraded quality"})
    if sp is not None and sp > 1 and attn in ULYSSES_UNSUPPORTED_ATTN:
        _err(errors, "training.attn_implementation",
             f"attn_implementation {attn!r} does not work with Ulysses SP (sp_size > 1); use flash_attention_2 or sdpa")
    if flags["offload_params"] and stage is not None and stage != 3:
        _err(errors, "training.offload_params", "offload_params needs zero_stage 3 (only ZeRO-3 partitions parameters)")
    if flags["offload_optimizer"] and stage == 0:
        _err(errors, "training.offload_optimizer", "offload_optimizer needs zero_stage 1, 2 or 3")
    if flags["checkpoint_offload"] and not flags["activation_checkpointing"]:
        _err(errors, "training.checkpoint_offload", "checkpoint_offload needs activation_checkpointing")
    if model is not None and model.num_experts:
        warnings.append({"field": "model.config", "message":
                         f"mixture-of-experts config ({model.num_experts} experts, {model.experts_per_token} per "
                         "token): parameters count every expert; activations count the routed experts as a dense "
                         "MLP of experts_per_token x moe_intermediate_size"})
    if dtype == "fp16":
        warnings.append({"field": "training.dtype", "message": "fp16 needs loss scaling; bf16 is the usual choice"})

    if errors or model is None or gpu is None:
        return None, errors, warnings
    spec = Spec(model=model, gpu=gpu, gpus_per_node=gpn, num_nodes=nodes, cpu_gib_per_node=float(cpu_gib), sp=sp,
                dp=dp, seq_len=seq, micro_batch_size=mbs, grad_accum=ga, dtype=dtype, zero_stage=stage,
                attn=attn, **flags)
    return spec, errors, warnings
