"""Traced estimate: run the real Hugging Face model on one rank's shard under FakeTensorMode and measure.

The model is built from its config with fake parameters (no real memory, no weights download), forward and
backward of one micro batch run under torch's MemTracker, and the peak of everything that is neither a parameter
nor a buffer (activations, logits/loss, temporaries, the all-to-all copies) is reported beside the analytical
activations + logits_and_loss + comm_buffers of the same plan. Parameter gradients are dropped as soon as they are
accumulated, as ZeRO's reduce-scatter does, so they do not pile up in the figure.

Ulysses is emulated in one process: the attention function is wrapped (as DeepSpeed's UlyssesSPAttentionHF wraps
the configured kernel) and the all-to-all is replaced by a local re-layout with the same shapes and copies:
[b, heads, s/sp, d] -> [b, heads/sp, s, d] (kv heads replicated to sp_size when fewer), and back.

TiledMLP is DeepSpeed's own (`ulysses_sp.TiledMLP`, pure autograd, ceil(seqlen / hidden) shards as ALST and the
trainer use it). Checkpoint offload is emulated as DeepSpeed's `CheckpointHiddenStatesOffload` behaves on a GPU: each
checkpointed layer's input is moved off the traced device when the checkpoint saves it and allocated again when its
layer's backward needs it, except the last layer's (keep_last_count = 1), which stays.

Transformers builds an S x S boolean causal mask for "sdpa" when it cannot prove the mask unneeded (under fake
tensors it cannot); the wrapped attention never reads it (is_causal, as flash attention on the GPU), so the trace
asks for no mask: a CPU-trace artifact of S^2 bytes otherwise (1 GiB at 32K tokens).

torch and transformers (and DeepSpeed for TiledMLP) are imported here only, lazily. Runs on CPU in seconds.
"""
from __future__ import annotations

import contextlib

from .memory import GIB, estimate_memory
from .traced_liger import liger_standins, liger_swiglu
from .validation import validate

_HF_TYPES = {"qwen3": "qwen3", "qwen2": "qwen2", "mistral": "mistral", "llama": "llama"}


def hf_config(model, dtype):
    """A transformers config for a ModelSpec (presets map to their architecture; anything else to Llama)."""
    from transformers import AutoConfig

    mtype = _HF_TYPES.get(model.model_type, "llama")
    kw = dict(hidden_size=model.hidden_size, num_hidden_layers=model.num_hidden_layers,
              num_attention_heads=model.num_attention_heads, num_key_value_heads=model.num_key_value_heads,
              head_dim=model.head_dim, intermediate_size=model.intermediate_size, vocab_size=model.vocab_size,
              tie_word_embeddings=model.tie_word_embeddings,
              max_position_embeddings=max(model.max_position_embeddings or 0, 1 << 22))
    if mtype == "llama":
        kw["attention_bias"] = model.qkv_bias
    cfg = AutoConfig.for_model(mtype, **kw)
    cfg.use_cache = False
    return cfg


class _Relayout:
    """Autograd function pair emulating DeepSpeed's `_DimZeroAllToAll` memory: a new tensor of the same bytes."""

    @staticmethod
    def make():
        import torch

        class SeqToHeads(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, sp):  # [b, H, s, d] -> [b, H/sp, s*sp, d]
                b, H, s, d = x.shape
                ctx.sp = sp
                return x.reshape(b, sp, H // sp, s, d).transpose(1, 2).reshape(b, H // sp, sp * s, d).contiguous()

            @staticmethod
            def backward(ctx, g):
                b, Hl, S, d = g.shape
                sp = ctx.sp
                out = g.reshape(b, Hl, sp, S // sp, d).transpose(1, 2).reshape(b, Hl * sp, S // sp, d)
                return out.contiguous(), None

        class HeadsToSeq(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, sp):  # [b, H/sp, S, d] -> [b, S/sp, H, d]
                b, Hl, S, d = x.shape
                ctx.sp = sp
                out = x.reshape(b, Hl, sp, S // sp, d).permute(0, 3, 2, 1, 4).reshape(b, S // sp, sp * Hl, d)
                return out.contiguous()

            @staticmethod
            def backward(ctx, g):
                b, s, H, d = g.shape
                sp = ctx.sp
                out = g.reshape(b, s, sp, H // sp, d).permute(0, 3, 2, 1, 4).reshape(b, H // sp, sp * s, d)
                return out.contiguous(), None

        return SeqToHeads, HeadsToSeq


@contextlib.contextmanager
def _emulated_ulysses(sp: int):
    """Temporarily route HF's "sdpa" attention through an emulated Ulysses wrapper (causal, no mask)."""
    import torch
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    seq_to_heads, heads_to_seq = _Relayout.make()
    original = ALL_ATTENTION_FUNCTIONS["sdpa"]
    original_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        kv = key.shape[1]
        if sp > 1:
            if kv < sp:  # ulysses_sp.py: repeat_interleave kv heads up to sp_size
                key = key.repeat_interleave(sp // kv, dim=1)
                value = value.repeat_interleave(sp // kv, dim=1)
            query, key, value = (seq_to_heads.apply(x, sp) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
        if sp > 1:
            return heads_to_seq.apply(out, sp), None
        return out.transpose(1, 2).contiguous(), None

    ALL_ATTENTION_FUNCTIONS["sdpa"] = attention
    ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = original
        ALL_MASK_ATTENTION_FUNCTIONS["sdpa"] = original_mask


def _tile_mlps(model, liger_kernel: bool) -> None:
    """Route every gated MLP through DeepSpeed's TiledMLP with ceil(seqlen / hidden) shards (ulysses_sp.py). Each
    shard runs the MLP functionally (HF's act(gate) * up, or Liger's fused SwiGLU stand-in): MemTracker's module
    hooks cannot follow the no-grad forward TiledMLP runs its shards in."""
    import math
    import types

    import torch.nn.functional as F
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    silu_mul = liger_swiglu() if liger_kernel else None

    def shard_forward(mlp, x):
        gate, up = F.linear(x, mlp.gate_proj.weight), F.linear(x, mlp.up_proj.weight)
        act = silu_mul.apply(gate, up) if silu_mul is not None else mlp.act_fn(gate) * up
        return F.linear(act, mlp.down_proj.weight)

    def tiled(self, x):
        shards = max(1, math.ceil(x.shape[-2] / x.shape[-1]))
        params = [self.down_proj.weight, self.gate_proj.weight, self.up_proj.weight]
        return TiledMLP.apply(shard_forward, self, x, shards, params)

    for module in model.modules():
        if all(hasattr(module, a) for a in ("gate_proj", "up_proj", "down_proj")):
            module.forward = types.MethodType(tiled, module)


@contextlib.contextmanager
def _offloaded_checkpoints(model):
    """Checkpoint offload as seen from the device: each checkpointed layer's input leaves the traced device when the
    checkpoint saves it (a meta-device stand-in) and comes back as a new tensor when backward unpacks it; the last
    layer's input stays (DeepSpeed offload_activations.py keep_last_count = 1)."""
    import types

    import torch
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    marked: dict[int, bool] = {}

    def marking(layer_index):
        def forward(self, *args, **kwargs):
            if args and isinstance(args[0], torch.Tensor) and layer_index < len(layers) - 1:
                marked[id(args[0])] = True
            return type(self).forward(self, *args, **kwargs)
        return forward

    def pack(t):
        if marked.pop(id(t), False):
            return ("offloaded", t.to("meta"), t.device)
        return t

    def unpack(packed):
        if isinstance(packed, tuple) and packed[0] == "offloaded":
            _, meta, device = packed
            return torch.empty(meta.shape, dtype=meta.dtype, device=device).requires_grad_(meta.requires_grad)
        return packed

    for i, layer in enumerate(layers):
        layer.forward = types.MethodType(marking(i), layer)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def config_for_plan(spec):
    """The HF config to trace: the plan's own config.json when it gives one (any architecture), else the preset's."""
    from transformers import AutoConfig

    raw = spec.plan.model.config
    if isinstance(raw, dict) and raw.get("model_type"):
        kw = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "_name_or_path",
                                                        "transformers_version", "torch_dtype", "dtype")}
        cfg = AutoConfig.for_model(raw["model_type"], **kw)
        cfg.use_cache = False
        return cfg
    return hf_config(spec.model, None)


def trace_peak_bytes(spec, cfg=None, tracker=None, loss_head=None) -> dict:
    """Run one micro batch of `spec` (one rank's shard) under FakeTensorMode; return peak bytes by category.
    `tracker` is the MemTracker (or a subclass, such as bench/allocator_replay.py's recorder) to trace with.
    `loss_head(model, labels)`, when given, replaces the model's output head by one whose "logits" are the loss
    (the trainer's tiled logits loss, which plan/ cannot import): the step's loss is then their sum."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import AutoModelForCausalLM

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    cfg = cfg if cfg is not None else hf_config(spec.model, dtype)
    b, s = spec.micro_batch_size, spec.seq_len // spec.sp
    with FakeTensorMode(allow_non_fake_inputs=False):
        torch.manual_seed(0)
        try:
            if spec.attn == "eager":
                raise ValueError("eager requested")
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
        except ValueError:
            if spec.sp > 1:  # Ulysses needs a kernel that takes no mask (flash/sdpa), as DeepSpeed does
                raise
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="eager")
        model.train()
        if spec.activation_checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        for p in model.parameters():  # ZeRO frees each gradient once it is reduce-scattered
            p.register_post_accumulate_grad_hook(lambda p: setattr(p, "grad", None))
        ids = torch.randint(0, spec.model.vocab_size, (b, s))
        labels = torch.randint(0, spec.model.vocab_size, (b, s))
        pos = torch.arange(s).unsqueeze(0).expand(b, s)
        tracker = tracker if tracker is not None else MemTracker()
        tracker.track_external(model, ids, labels, pos)
        liger = liger_standins(model, spec.liger_fused_loss) if spec.liger_kernel else contextlib.nullcontext()
        offload = (_offloaded_checkpoints(model) if spec.checkpoint_offload and spec.activation_checkpointing
                   else contextlib.nullcontext())
        with _emulated_ulysses(spec.sp), liger:
            if spec.tiled_mlp:  # over Liger's SwiGLU when asked, as the trainer tiles the MLP the model has
                _tile_mlps(model, spec.liger_kernel)
            if loss_head is not None:
                loss_head(model, labels)
            with offload, tracker:
                if loss_head is not None:
                    loss = model(input_ids=ids, position_ids=pos).logits.sum()
                elif spec.upcast_logits:  # Transformers' ForCausalLMLoss (fp32 logits)
                    loss = model(input_ids=ids, labels=labels, position_ids=pos).loss
                else:  # cross-entropy on the model's dtype, as worker/trainer/modeling.py token_loss_sum
                    logits = model(input_ids=ids, position_ids=pos).logits
                    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                             labels.reshape(-1), reduction="none").float().sum()
                    del logits
                loss.backward()
        snap = tracker.get_tracker_snapshot("peak")
    peak = dict(snap[ids.device])
    # Parameters/buffers are model states; "Gradient" is the parameter gradient in flight before the hook drops
    # it (the analytical model counts that under zero_buffers).
    static = sum(peak.get(k, 0) for k in ("Parameter", "Buffer", "Other", "Gradient"))
    return {"total": peak.get("Total", 0), "static": static, "categories": peak,
            "activation_peak": peak.get("Total", 0) - static}


def analytical_activation_peak(spec) -> float:
    """activations + logits_and_loss + comm_buffers at the analytical peak phase of the activations alone."""
    mem = estimate_memory(spec)
    act_phases = mem["activation_phases"]
    return max(sum(v for k, v in ph.items()) for ph in act_phases.values())


def traced_estimate(plan) -> dict:
    """Traced vs analytical activation+logits peak (GiB) for a plan's per-rank shard."""
    v = validate(plan)
    spec = v.spec
    if spec is None:
        return {"valid": False, "errors": v.errors}
    try:
        traced = trace_peak_bytes(spec, config_for_plan(spec))
    except ValueError as e:  # e.g. an architecture without sdpa support under sp_size > 1
        return {"valid": False, "errors": [{"field": "model.config", "message": f"cannot trace this model: {e}"}]}
    analytical = analytical_activation_peak(spec)
    not_traced = [k for k in ("tiled_logits_loss",) if getattr(spec, k)]
    return {"valid": True, "not_traced": not_traced,
            "liger": "stand-ins with Liger's allocations (Triton does not run on CPU)" if spec.liger_kernel else None,
            "traced_activation_peak_gib": traced["activation_peak"] / GIB,
            "analytical_activation_peak_gib": analytical / GIB,
            "ratio": analytical / traced["activation_peak"] if traced["activation_peak"] else None,
            "traced_peak_categories_gib": {k: v / GIB for k, v in traced["categories"].items()}}
