"""Rules that tie a plan's fields together, checked once, up front (torchtitan's parallel_dims.py idea).

Each broken rule is one error naming the field to change. Warnings name a field too but do not stop a plan.
The model's architecture comes from the catalog (`model.preset`) or the plan's own `model.config`.
"""
from __future__ import annotations

from . import catalog as cat
from .errors import FieldError, error
from .model import PASSKEY_MIN_LEN, Plan

# Ulysses (sp_size > 1): DeepSpeed's UlyssesSPAttentionHF.register_with_transformers rejects "eager" (ulysses_sp.py:
# it needs a causal kernel that takes no mask; the masks are discarded after the all-to-all).
ULYSSES_UNSUPPORTED_ATTN = ("eager",)
# The trainer's byte-level tokenizer (worker/trainer/data.py: 256 bytes, EOS 257, PAD 258) for model_path null.
BYTE_TOKENIZER_VOCAB = 259


def known_gpus() -> str:
    return (f"known GPUs: {', '.join(cat.gpus())} (or give an object with the columns name, "
            + ", ".join(cat.GPU_FIELDS) + ")")


def resolve_model(plan: Plan, errors: list[FieldError]) -> cat.ModelSpec | None:
    m = plan.model
    if (m.preset is None) == (m.config is None):
        errors.append(error("model", 'give exactly one of model.preset (a catalog name) or model.config '
                                     '(a Hugging Face config.json)'))
        return None
    if m.config is not None:
        try:
            return cat.model_from_config(m.config)
        except cat.ConfigError as e:
            errors.append(error(f"model.config.{e.key}" if e.key else "model.config", str(e)))
            return None
    spec = cat.models().get(m.preset or "")
    if spec is None:
        errors.append(error("model.preset", f"unknown model preset {m.preset!r}; known presets: "
                                            f"{', '.join(cat.models())} (or give model.config, any Hugging Face "
                                            "config.json)"))
    return spec


def resolve_gpu(plan: Plan, errors: list[FieldError]) -> cat.GpuSpec | None:
    g = plan.hardware.gpu
    if not isinstance(g, str):
        return cat.GpuSpec(name=g.name, **{k: float(getattr(g, k)) for k in cat.GPU_FIELDS})
    spec = cat.gpus().get(g)
    if spec is None:
        errors.append(error("hardware.gpu", f"unknown GPU {g!r}; {known_gpus()}"))
    return spec


def _layout(plan: Plan, errors: list[FieldError]) -> None:
    hw, par, t = plan.hardware, plan.parallel, plan.training
    sp, dp = par.sp_size, par.dp_size
    if sp * dp != hw.gpus_per_node * hw.num_nodes:
        errors.append(error("parallel.dp_size",
                            f"sp_size x dp_size = {sp} x {dp} = {sp * dp} ranks, but the hardware has gpus_per_node "
                            f"x num_nodes = {hw.gpus_per_node} x {hw.num_nodes} = {hw.gpus_per_node * hw.num_nodes} "
                            "GPUs; make them equal"))
    if t.seq_len % sp:
        errors.append(error("training.seq_len", f"seq_len ({t.seq_len}) is not divisible by sp_size ({sp}); nearest "
                                                f"multiples: {t.seq_len // sp * sp} or {(t.seq_len // sp + 1) * sp}"))
    if sp > 1 and t.attn_implementation in ULYSSES_UNSUPPORTED_ATTN:
        errors.append(error("training.attn_implementation",
                            f"attn_implementation {t.attn_implementation!r} does not work with Ulysses SP "
                            "(sp_size > 1); use flash_attention_2 or sdpa"))


def _memory_switches(plan: Plan, errors: list[FieldError]) -> None:
    t = plan.training
    if t.offload_params and t.zero_stage != 3:
        errors.append(error("training.offload_params",
                            "offload_params needs zero_stage 3 (only ZeRO-3 partitions parameters)"))
    if t.offload_optimizer and t.zero_stage == 0:
        errors.append(error("training.offload_optimizer", "offload_optimizer needs zero_stage 1, 2 or 3"))
    if t.checkpoint_offload and not t.activation_checkpointing:
        errors.append(error("training.checkpoint_offload", "checkpoint_offload needs activation_checkpointing"))
    if t.bf16_optimizer_states and t.dtype != "bf16":
        errors.append(error("training.bf16_optimizer_states", f"bf16_optimizer_states needs dtype bf16, not {t.dtype}"))
    if t.bf16_optimizer_states and t.zero_stage == 0:
        errors.append(error("training.bf16_optimizer_states", "bf16_optimizer_states needs zero_stage 1, 2 or 3 "
                                                              "(DeepSpeed keeps bf16 master weights in ZeRO only)"))
    if t.bf16_optimizer_states and t.offload_optimizer:
        # DeepSpeed 0.19.8 supports it only with DeepSpeedCPUAdam(fp32_optimizer_states=False) and asserts otherwise
        # (runtime/base_optimizer.py:508-518); the trainer's optimizer is the Transformers Trainer's AdamW, which
        # Accelerate swaps for DeepSpeedCPUAdam(lr, weight_decay, adamw_mode) with fp32 states
        # (accelerate/utils/deepspeed.py map_pytorch_optim_to_deepspeed), so such a run would stop at start-up.
        errors.append(error("training.bf16_optimizer_states",
                            "bf16_optimizer_states with offload_optimizer is not supported by `ulab train`: "
                            "Accelerate builds the offloaded DeepSpeedCPUAdam with fp32 states; turn one of them off"))
    if t.document_len is not None and t.document_len > t.seq_len:
        errors.append(error("training.document_len", f"document_len ({t.document_len}) is longer than seq_len "
                                                     f"({t.seq_len}); leave it out for one document per sequence"))


def _heads(plan: Plan, model: cat.ModelSpec, errors: list[FieldError], warnings: list[FieldError]) -> None:
    sp, seq = plan.parallel.sp_size, plan.training.seq_len
    heads, kv = model.num_attention_heads, model.num_key_value_heads
    if sp > heads:
        errors.append(error("parallel.sp_size", f"sp_size ({sp}) exceeds num_attention_heads ({heads}): Ulysses gives "
                                                "every rank at least one whole attention head"))
    if heads % sp:
        errors.append(error("parallel.sp_size", f"num_attention_heads ({heads}) is not divisible by sp_size ({sp})"))
    if kv % sp and sp % kv:
        errors.append(error("parallel.sp_size",
                            f"num_key_value_heads ({kv}) and sp_size ({sp}) are incompatible: one must divide the "
                            "other (kv heads are split when kv % sp == 0, replicated when sp % kv == 0)"))
    mpe = model.max_position_embeddings
    if mpe and seq > mpe:
        warnings.append(error("training.seq_len",
                              f"seq_len ({seq}) exceeds the model's max_position_embeddings ({mpe}); use RoPE scaling "
                              f'(e.g. rope_scaling {{"rope_type": "yarn", "factor": {seq / mpe:.1f}}}) or expect '
                              "degraded quality"))
    if model.num_experts:
        warnings.append(error("model.config",
                              f"mixture-of-experts config ({model.num_experts} experts, {model.experts_per_token} "
                              "per token): parameters count every expert; activations count the routed experts as a "
                              "dense MLP of experts_per_token x moe_intermediate_size"))


def _run(plan: Plan, model: cat.ModelSpec | None, errors: list[FieldError]) -> None:
    """The trainer's `run` section, when the plan has one."""
    run = plan.run
    if run is None:
        return
    sp, seq = plan.parallel.sp_size, plan.training.seq_len
    for i, stage in enumerate(run.stages or []):
        if stage.seq_len % sp:
            errors.append(error(f"run.stages[{i}].seq_len",
                                f"{stage.seq_len} is not divisible by sp_size ({sp})"))
        if stage.seq_len > seq:
            errors.append(error(f"run.stages[{i}].seq_len",
                                f"{stage.seq_len} is longer than training.seq_len ({seq}), the length the plan is "
                                "estimated at; set training.seq_len to the longest stage"))
    trained = False
    for i, entry in enumerate(run.stages or []):
        if entry.kind == "train":
            trained = True
            continue
        if not trained:
            errors.append(error(f"run.stages[{i}].kind", "a passkey test scores the model of the training stage "
                                                        "before it: put a training stage first"))
        if any(n > entry.seq_len for n in entry.lengths or []):
            errors.append(error(f"run.stages[{i}].lengths", f"every length must be at most the stage's seq_len "
                                                           f"({entry.seq_len})"))
        elif not entry.test_lengths(sp):
            errors.append(error(f"run.stages[{i}].lengths", f"no length is at least {PASSKEY_MIN_LEN} tokens once "
                                                           f"rounded down to a multiple of sp_size ({sp})"))
    # model_path null with model.preset: the preset's checkpoint, looked up where it is loaded (approval, against the
    # executor's models root, and the trainer: ULAB_MODELS_DIR/<preset>, then the hub cache). A planning host never
    # holds the weights, so planning, exports and the dry run do not look for them.
    if run.model_path is None and run.tokenizer is None and plan.model.config is not None:
        if model is not None and model.vocab_size < BYTE_TOKENIZER_VOCAB:
            errors.append(error("model.config.vocab_size", f"the built-in byte tokenizer (model_path null) needs at "
                                                           f"least {BYTE_TOKENIZER_VOCAB} tokens"))


def check(plan: Plan) -> tuple[cat.ModelSpec | None, cat.GpuSpec | None, list[FieldError], list[FieldError]]:
    """(model, gpu, errors, warnings) of a plan whose fields are individually valid."""
    errors: list[FieldError] = []
    warnings: list[FieldError] = []
    model = resolve_model(plan, errors)
    gpu = resolve_gpu(plan, errors)
    _layout(plan, errors)
    _memory_switches(plan, errors)
    if model is not None:
        _heads(plan, model, errors, warnings)
    _run(plan, model, errors)
    if plan.training.dtype == "fp16":
        warnings.append(error("training.dtype", "fp16 needs loss scaling; bf16 is the usual choice"))
    return model, gpu, errors, warnings
