"""Per-GPU memory of one training step under Ulysses SP + DeepSpeed ZeRO, term by term.

Everything is bytes per rank unless a name says otherwise. The peak is the largest of three phases of a step:

- "loss":      the backward of the cross-entropy, when the fp32 logits, log-softmax and their gradients are alive
               on top of the checkpointed hidden states (or every layer's saved tensors without checkpointing);
- "layer":     the backward of one decoder layer (after its recompute under activation checkpointing);
- "optimizer": the optimizer step (no activations, but ZeRO-1/2 materialize fp32 gradient partitions).

Sources for the formulas are cited beside each term. Notation: t = micro_batch * seq_len / sp_size tokens held by a
rank between the all-to-alls, S = seq_len, h hidden, a heads, k kv heads, d head_dim, I intermediate, V vocab,
L layers, B bytes of the training dtype, psi parameter count, N = dp_size * sp_size ranks that ZeRO shards over.
"""
from __future__ import annotations

import math

from . import liger
from .allocator import device_total, reserved_peak
from .model import DTYPE_BYTES

GIB = 2 ** 30

# ZeRO paper (Rajbhandari et al. 2020, sec. 3.1): mixed-precision Adam keeps fp32 master weights, momentum and
# variance = K = 12 bytes per parameter (8 when training in fp32, where the master copy is the parameter itself).
ADAM_BYTES_MIXED = 12
ADAM_BYTES_FP32 = 8
# bf16 master weights and moments (`training.bf16_optimizer_states`: DeepSpeed's bf16.bf16_master_weights_and_grads +
# bf16_optimizer_states, runtime/base_optimizer.py `_configure_master_weights` returns torch.bfloat16 as the master
# dtype): the master copy (2) and both moments (2 + 2) in bf16 -> 6 bytes per parameter; master gradients 2 bytes.
ADAM_BYTES_BF16_STATES = 6
# DeepSpeed defaults (deepspeed/runtime/zero/config.py): stage3_max_live_parameters = 1e9, sub_group_size = 1e9.
MAX_LIVE_PARAMETERS = 1e9
SUB_GROUP_SIZE = 1e9
# ZeRO communication buckets as the trainer's DeepSpeed config sets them (plan.launch.deepspeed_config:
# reduce_bucket_size, allgather_bucket_size and stage3_prefetch_bucket_size): DeepSpeed's 5e7-element default
# (deepspeed/runtime/zero/config.py), but never more than the model itself (a tiny model would be dwarfed by them and
# every rank would hold buffers many times its size).
MAX_BUCKET_ELEMENTS = int(5e7)
MIN_BUCKET_ELEMENTS = int(1e5)


def zero_bucket_elements(total_params: float) -> int:
    """Elements of each ZeRO bucket (reduce, allgather, ZeRO-3 prefetch) the trainer configures."""
    return int(max(MIN_BUCKET_ELEMENTS, min(MAX_BUCKET_ELEMENTS, total_params)))


# ALST / ArcticTraining tiled logits loss: shards sized so each shard's fp32 logits are about 1 GiB.
TILED_LOSS_SHARD_BYTES = GIB
# cuBLAS/cuBLASLt workspaces live in the caching allocator (torch sizes them 32 MiB per handle on Hopper);
# two streams (compute + DeepSpeed's reduce/prefetch streams) -> 64 MiB.
CUBLAS_WORKSPACE_BYTES = 64 * 2 ** 20
# What `nvidia-smi` shows on top of torch's allocated bytes (plan-v1 `device_total_gib`): the caching allocator's
# reserved peak, the CUDA context and NCCL's buffers, modelled in plan.allocator.
# Attention kernels whose backward allocates dk/dv at the query head count under GQA (see layer_terms):
# flash-attn's mha_bwd (dk_expanded, dv_expanded), and torch SDPA since Transformers passes enable_gqa=True to it
# when there is no mask (transformers/integrations/sdpa_attention.py `use_gqa_in_sdpa`: "CUDA ... require no mask
# and supported head dims"), where torch's flash kernel (the same FlashAttention-2 code) expands dk/dv the same way.
GQA_EXPANDING_BACKWARD = ("flash_attention_2", "sdpa")
# Host memory a training process holds outside of offloaded tensors (CUDA host-side context, torch, NCCL host
# buffers, the data loader): about 4 GiB per rank.
HOST_BYTES_PER_RANK = 4 * GIB


def norm_saved(n: int, B: int) -> int:
    """Bytes per token an HF RMSNorm (LlamaRMSNorm / Qwen3RMSNorm) saves for backward over a width n:
    the fp32 copy of its input (pow/mul save it) and the normalized tensor cast back to the dtype (saved by the
    weight multiply). Its output is counted by whichever op saves it."""
    return (4 + B) * n


def layer_terms(m, sp: int, B: int, tiled_mlp: bool, liger_kernel: bool = False, checkpointed: bool = True,
                attn: str = "flash_attention_2") -> dict:
    """Per-token bytes of one decoder layer (SwiGLU MLP, GQA, RMSNorm, RoPE, no dropout).

    This is Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4.1)
    redone for the Hugging Face Llama/Qwen3 modules: no dropout masks, RMSNorm keeps an fp32 copy, SwiGLU
    keeps gate, up, silu(gate) and their product, flash attention keeps q, k, v, out and the fp32 log-sum-exp
    instead of the s x s scores. Under Ulysses (DeepSpeed ulysses_sp.py, ALST paper sec. 3.1) q/k/v are
    all-to-all'ed to [S, heads/sp] before the kernel: the same bytes per rank, except that kv heads are
    replicated to sp_size when kv_heads < sp_size (repeat_interleave in `_combine_local_sequences`).
    With `liger_kernel` the norms and the MLP are Liger's (plan.liger: RMSNorm saves its input and one fp32 rstd
    per row, SwiGLU saves gate and up and recomputes the activation; RoPE rotates q and k in place and saves only
    cos/sin, as HF's does, so it changes no saved bytes). `checkpointed`: the layer runs as the recompute of an
    activation checkpoint, whose input (the checkpoint) is held already.
    """
    h, a, k, d, inter = m.hidden_size, m.num_attention_heads, m.num_key_value_heads, m.head_dim, m.mlp_width
    kv_eff = max(k, sp) if sp > 1 else k
    qd, kvd = a * d, kv_eff * d
    if liger_kernel:
        norm1 = liger.norm_saved(h, B, checkpointed) + B * h     # input (the checkpoint) + rstd; output saved by q/k/v
        qk_norm = (liger.norm_saved(d, B, False) * a + liger.norm_saved(d, B, False) * k) if m.qk_norm else 0
        norm2 = liger.norm_saved(h, B, False) + B * h            # the post-attention residual + rstd; output
        mlp = 0 if tiled_mlp else liger.swiglu_saved(inter, B)
        mlp_bwd_extra = 0 if tiled_mlp else liger.swiglu_backward_extra(inter, B)
    else:
        norm1 = norm_saved(h, B) + B * h                       # + its output, saved by q/k/v projections
        qk_norm = norm_saved(a * d, B) + norm_saved(k * d, B) if m.qk_norm else 0
        norm2 = norm_saved(h, B) + B * h                       # + its output, saved by gate/up projections
        mlp = 0 if tiled_mlp else 4 * B * inter                # gate, up, silu(gate), silu(gate)*up
        # at the SwiGLU multiply's backward the product is freed but d(prod), d(act), d(up) exist -> +2*B*I
        mlp_bwd_extra = 0 if tiled_mlp else 2 * B * inter
    attn_in = B * (qd + 2 * kvd)                            # q, k, v as the attention kernel saves them
    attn_out = B * qd + 4 * a                               # output + fp32 logsumexp (a/sp heads over S tokens)
    o_in = B * qd if sp > 1 else 0                          # after the all-to-all back: a new tensor o_proj saves
    attn_saved = norm1 + qk_norm + attn_in + attn_out + o_in
    saved = attn_saved + norm2 + mlp
    # Attention backward, beyond what the layer saved: dq, dk, dv and the fp32 dq accumulator (FlashAttention-2
    # bwd, Dao 2023; flash_api.cpp mha_bwd: dq_accum is float32 [b, s, heads, d]) while the MLP's saved tensors
    # are already freed. Under GQA (kv heads < q heads on the rank) mha_bwd writes dk and dv at the query head
    # count (dk_expanded, dv_expanded = empty({b, s_k, num_heads, d})) and sums them down afterwards.
    dq_accum = 4 * qd
    expanded = 2 * B * qd if (attn in GQA_EXPANDING_BACKWARD and kv_eff < a) else 0
    attn_bwd = B * (qd + 2 * kvd) + dq_accum + expanded
    grad_stream = 2 * B * h                                 # incoming grad of the layer output + the residual grad
    # Sizes per token of the layer's transient tensors (plan.allocator): hidden-wide (B h, and HF norms' fp32
    # copies), q-wide, kv-wide, the fp32 dq accumulator and an MLP intermediate.
    blocks = [B * h, B * qd, B * kvd, dq_accum] + ([] if liger_kernel else [4 * h]) + ([] if tiled_mlp else [B * inter])
    return {"saved": saved, "attn_saved": attn_saved, "mlp_bwd_extra": mlp_bwd_extra, "attn_bwd": attn_bwd,
            "grad_stream": grad_stream, "q_bytes": B * qd, "kv_eff": kv_eff, "blocks": blocks}


def eager_scores_bytes(m, sp: int, B: int, S: int, b: int) -> int:
    """The O(S^2) part of eager/math attention per layer and rank: HF eager_attention_forward keeps the fp32
    softmax output (softmax(dtype=float32)) and its cast to the dtype for the probs @ V matmul."""
    return b * (m.num_attention_heads // sp) * S * S * (4 + B)


def adam_bytes(stage: int, B: int, bf16_states: bool = False) -> int:
    """Optimizer bytes per parameter. ZeRO-1/2 always clone an fp32 master partition (stage_1_and_2.py
    `single_partition_of_fp32_groups`), even for fp32 models; ZeRO-3 reuses an fp32 partition as the master
    (stage3.py `_create_fp32_partitions`), and without ZeRO a torch optimizer updates fp32 params in place.
    With `bf16_optimizer_states` the master partition and the moments are bf16 (ADAM_BYTES_BF16_STATES)."""
    if bf16_states:
        return ADAM_BYTES_BF16_STATES
    if B == 4 and stage in (0, 3):
        return ADAM_BYTES_FP32
    return ADAM_BYTES_MIXED


def state_terms(spec) -> dict:
    """Model states per GPU (ZeRO paper sec. 3-5) sharded over N = dp*sp: DeepSpeed's engine hands ZeRO the
    `seq_data_parallel_group` (engine.py `_configure_zero_optimizer`), so Ulysses ranks shard states too."""
    m, B, N, z = spec.model, spec.dtype_bytes, spec.world, spec.zero_stage
    psi = m.total_params
    params = B * psi / (N if z == 3 else 1)
    if spec.offload_params:
        params = 0.0
    # Low-precision gradients: full with ZeRO 0/1, a partition with ZeRO-2/3. With optimizer offload the
    # partition buffer lives on the CPU (stage3.py: grad_partitions_flat_buffer on self.device = cpu;
    # stage_1_and_2.py accumulates into pinned CPU fp32 partitions).
    grads = B * psi / (N if z >= 2 else 1)
    if spec.offload_optimizer and z >= 2:
        grads = 0.0
    # fp32 gradient buffer ZeRO-3 keeps on the GPU when the optimizer is not offloaded
    # (stage3.py initialize_optimizer_states: gradient_buffer of the largest sub group, sub_group_size=1e9).
    # (in the master dtype: bf16 with bf16_optimizer_states)
    # Open lead (docs/planner-accuracy.md; bench/corpus_consistency.py --without-fp32-grad-buffer): DeepSpeed drops
    # this buffer after set-up when nothing is offloaded and makes each sub group's fp32 gradients at the step; the
    # corpus rows fall 3.7 GiB short without it, so it stays until a GPU run measures it.
    master = master_grad_bytes(spec)
    on_gpu = z == 3 and not spec.offload_optimizer and B < 4
    fp32_grad_buffer = master * min(psi / N, SUB_GROUP_SIZE) if on_gpu else 0.0
    opt_per_param = adam_bytes(z, B, spec.bf16_optimizer_states)
    optimizer = 0.0 if spec.offload_optimizer else opt_per_param * psi / (N if z >= 1 else 1)
    # ZeRO-1/2 create the fp32 gradient partition at the step (stage_1_and_2.py: single_partition_of_fp32_groups
    # .grad), transient and only on the GPU when the optimizer is on the GPU.
    step_fp32_grads = master * psi / N if (z in (1, 2) and not spec.offload_optimizer) else 0.0
    return {"params": params, "grads": grads + fp32_grad_buffer, "optimizer": optimizer,
            "step_fp32_grads": step_fp32_grads}


def master_grad_bytes(spec) -> int:
    """Bytes per element of the master gradients the optimizer reads: fp32, or bf16 with bf16_optimizer_states."""
    return 2 if spec.bf16_optimizer_states else 4


def grad_comm_bytes(spec) -> int:
    """Bytes per element of ZeRO's gradient reduction. With sp > 1 DeepSpeed's engine sets communication_data_type
    to the config's `seq_parallel_communication_data_type` (engine.py; DeepSpeed's default "fp32"); without SP it
    reduces in the training dtype."""
    return DTYPE_BYTES[spec.seq_parallel_communication_data_type] if spec.sp > 1 else spec.dtype_bytes


def zero_buffer_terms(spec) -> dict:
    """ZeRO communication buffers with the bucket sizes the trainer's DeepSpeed config sets (zero_bucket_elements:
    reduce_bucket_size = stage3_prefetch_bucket_size, explicit, so the Transformers integration's "auto" sizes do not
    apply). The IPG bucket has the gradient communication dtype (stage3.py: bucket.buffer =
    torch.empty(reduce_bucket_size, dtype=<comm dtype>)), see grad_comm_bytes."""
    m, B, z = spec.model, spec.dtype_bytes, spec.zero_stage
    h = m.hidden_size
    comm_bytes = grad_comm_bytes(spec)
    elements = zero_bucket_elements(m.total_params)
    bucket = comm_bytes * elements                           # the contiguous IPG bucket (stage3.py ipg_buckets)
    if z < 3:
        return {"layer": bucket if z >= 1 else 0.0, "loss": bucket if z >= 1 else 0.0, "largest_param": 0.0}
    prefetch = B * elements
    # Gathered parameters while a layer runs backward (its weights, gathered for the recompute and kept for the
    # backward) and the largest single-parameter gradient before it is copied into the bucket.
    widest = m.moe_intermediate_size if m.num_experts else m.intermediate_size
    if m.dense_layers:                                       # an MoE model's dense layers
        widest = max(widest, m.dense_intermediate_size)
    largest_param = h * max(widest, m.q_dim)
    layer_live = B * min(m.layer_params, max(MAX_LIVE_PARAMETERS, largest_param))   # max_live caps the sum only
    largest_grad = B * largest_param
    # During the loss the lm_head (tied: the embedding) weight is gathered in full (one parameter, never split).
    head_live = B * m.vocab_size * h
    return {"layer": layer_live + prefetch + bucket + largest_grad, "loss": head_live + prefetch + bucket,
            "largest_param": B * max(largest_param, m.vocab_size * h)}


# Shard sizes. The real shard count rounds up (shards = ceil(total / target)), so real shards are at most the target
# size and shrink by up to a factor n/(n+1) right after each boundary. Using the target size itself (capped by the
# whole sequence) errs high by less than 1/shards and keeps memory monotone in seq_len, which the max-context
# bisection relies on.
def tiled_loss_shard_tokens(spec) -> int:
    """ALST / ArcticTraining TiledFusedLogitsLoss: shards of about 1 GiB of fp32 logits."""
    return max(1, min(spec.local_tokens, TILED_LOSS_SHARD_BYTES // (4 * spec.model.vocab_size)))


def tiled_mlp_shard_tokens(spec) -> int:
    """DeepSpeed TiledMLP as ALST uses it: num_shards = ceil(seqlen / hidden_size) (ulysses_sp.py docstring),
    i.e. shards of about hidden_size tokens."""
    s_local = spec.seq_len // spec.sp
    return spec.micro_batch_size * min(s_local, spec.model.hidden_size)


def loss_bytes_per_token(V: int, B: int, upcast: bool) -> int:
    """Peak bytes per token of an untiled cross-entropy over V logits of B bytes.
    Upcast (transformers loss_utils.ForCausalLMLoss: logits.float() then cross_entropy):
      forward: bf16 logits (B*V) + fp32 upcast (4V) + log_softmax output (4V, saved);
      backward: saved log_softmax (4V) + nll_loss grad (4V) + log_softmax grad (4V) -> 12V, the peak.
    No upcast (ms-swift's sequence-parallel loss, trainers/sequence_parallel/utils.py loss_scale_sp_func:
    CrossEntropyLoss(reduction='none') on the model's logits): every [t, V] tensor is in the model's dtype, so
    forward 2*B*V (logits + saved log_softmax), backward 3*B*V (saved + the two gradients)."""
    if upcast:
        return max(12 * V, (B + 8) * V)
    return max(3 * B * V, 2 * B * V)


def loss_terms(spec, t: int) -> dict:
    """Bytes of the loss phase beyond the checkpoints: the lm_head's input and the logits/loss tensors, and the
    largest single block among them (for the allocator)."""
    m, B = spec.model, spec.dtype_bytes
    h, V = m.hidden_size, m.vocab_size
    if spec.liger_fused_loss:
        # Liger's fused linear cross-entropy (plan.liger.flce_bytes) replaces the CausalLM forward's lm_head + loss
        # (not with the tiled logits loss, which owns the head: training_fields.liger_fused_loss). The final
        # LigerRMSNorm saves its input and rstd; its output is the FLCE input, alive (not saved) while the loss runs.
        fl = liger.flce_bytes(t, V, h, B)
        final_norm = (liger.norm_saved(h, B, False) + B * h) * t
        return {"bytes": fl["total"] + final_norm,
                "blocks": [fl["logits_chunk"], fl["grad_input"], fl["grad_weight"], fl["loss_1d"]]}
    # the final RMSNorm (Liger's with liger_kernel) + its output, the lm_head input
    final_norm = ((liger.norm_saved(h, B, False) if spec.liger_kernel else norm_saved(h, B)) + B * h) * t
    per_token = loss_bytes_per_token(V, B, spec.upcast_logits)
    U = 4 if spec.upcast_logits else B                       # bytes of the loss's [t, V] tensors
    if spec.tiled_logits_loss:
        # DeepSpeed TiledFusedLogitsLoss (ALST sec. 3.3): forward+backward per shard, never the full logits;
        # x_grad = zeros_like(hidden) for the whole local sequence, and the lm_head weight gradient accumulates
        # over the shards before ZeRO reduces it (its `compute_params` defer the reduction to the last shard).
        shard = tiled_loss_shard_tokens(spec)
        logits = per_token * shard + B * h * t + B * V * h
        blocks = [U * V * shard, B * V * shard, B * h * t, B * V * h, 4 * h * t]
    else:
        logits = per_token * t
        blocks = [U * V * t, B * V * t, 4 * h * t]  # the loss's and the model's [t, V] logits, the norm's fp32 copy
    return {"bytes": logits + final_norm, "blocks": blocks}


def activation_terms(spec) -> dict:
    """Activation, logits and all-to-all bytes of the "loss" and "layer" phases, with each phase's transient bytes
    and largest transient block (plan.allocator)."""
    m, B, t, b, S, sp = spec.model, spec.dtype_bytes, spec.local_tokens, spec.micro_batch_size, spec.seq_len, spec.sp
    h, L = m.hidden_size, m.num_hidden_layers
    ac, lk = spec.activation_checkpointing, spec.liger_kernel
    lt = layer_terms(m, sp, B, spec.tiled_mlp, lk, ac, spec.attn)
    scores = eager_scores_bytes(m, sp, B, S, b) if spec.attn == "eager" else 0
    if ac:
        # HF gradient checkpointing keeps each decoder layer's input (Korthikanti et al. sec. 5: 2*s*b*h per
        # layer); ALST checkpoint offload moves them to the CPU, keeping the one in use plus the one in flight.
        kept_layers = min(L, 2) if spec.checkpoint_offload else L
        stored = kept_layers * B * h * t
    else:
        stored = L * (lt["saved"] * t + scores)
    loss = loss_terms(spec, t)
    # ---- one layer's backward ----
    layer_blocks = [x * t for x in lt["blocks"]] + [scores * 4 / (4 + B)]     # eager: the fp32 probabilities
    if spec.tiled_mlp:
        ts = tiled_mlp_shard_tokens(spec)
        # TiledMLP (ulysses_sp.py): per shard the SwiGLU intermediates and their grads (HF: 4 saved + 2 in the
        # backward = 6 B I per token; Liger: 3 + 1), plus x_grad for the whole sequence and the MLP weight grads
        # accumulated over shards (reduction deferred).
        shard_mlp = (liger.swiglu_saved(1, B) + liger.swiglu_backward_extra(1, B)) if lk else 6 * B
        mlp_peak = lt["saved"] * t + shard_mlp * m.mlp_width * ts + B * h * t + B * 3 * h * m.mlp_width
        layer_blocks += [B * m.mlp_width * ts, B * h * m.mlp_width]
    else:
        mlp_peak = (lt["saved"] + lt["mlp_bwd_extra"]) * t
    attn_peak = (lt["attn_saved"] + lt["attn_bwd"]) * t
    # eager: while the attention backs up, the saved probabilities are joined by their gradients (dtype + fp32)
    layer_work = max(mlp_peak + scores, attn_peak + 2 * scores) + lt["grad_stream"] * t
    # Ulysses all-to-all: a contiguous send copy and a receive buffer for the largest transfer (q / dq).
    comm = 2 * lt["q_bytes"] * t if sp > 1 else 0
    if ac:
        layer_act = stored + layer_work
    else:
        layer_act = stored + layer_work - lt["saved"] * t - scores
    framework = CUBLAS_WORKSPACE_BYTES + 24 * b * S + 2 * 2 * B * m.head_dim * t   # ids/labels/positions, rope
    return {"loss": {"activations": stored, "logits_and_loss": loss["bytes"], "comm_buffers": 0.0},
            "layer": {"activations": layer_act, "logits_and_loss": 0.0, "comm_buffers": comm},
            "blocks": loss["blocks"] + layer_blocks, "mlp_peak": mlp_peak, "attn_peak": attn_peak,
            "framework": framework, "checkpoint_bytes_cpu": (L * B * h * t if spec.checkpoint_offload else 0.0)}


def communicators(spec) -> int:
    """NCCL communicators a rank holds: the ZeRO/world group, the SP group and the DP group when distinct."""
    if spec.world == 1:
        return 0
    n = 1
    if 1 < spec.sp < spec.world:
        n += 2
    return n


def estimate_memory(spec) -> dict:
    st = state_terms(spec)
    zb = zero_buffer_terms(spec)
    act = activation_terms(spec)
    base = {"params": st["params"], "grads": st["grads"], "optimizer": st["optimizer"]}
    phases = {}
    for name in ("loss", "layer"):
        phases[name] = {**base, "activations": act[name]["activations"],
                        "logits_and_loss": act[name]["logits_and_loss"], "zero_buffers": zb[name],
                        "comm_buffers": act[name]["comm_buffers"], "framework_overhead": act["framework"]}
    phases["optimizer"] = {**base, "grads": st["grads"] + st["step_fp32_grads"], "activations": 0.0,
                           "logits_and_loss": 0.0, "zero_buffers": zb["layer"], "comm_buffers": 0.0,
                           "framework_overhead": act["framework"]}
    peak_phase = max(phases, key=lambda p: sum(phases[p].values()))
    breakdown = phases[peak_phase]
    allocated = sum(breakdown.values())
    # the ZeRO-3 gathered parameters (the largest one) and ZeRO-1/2's fp32 gradient partition at the step
    blocks = act["blocks"] + [zb["largest_param"], st["step_fp32_grads"]]
    res = reserved_peak(allocated, blocks, spec.expandable_segments)
    reserved = max(allocated, res["reserved"])
    cpu = cpu_terms(spec, act["checkpoint_bytes_cpu"])
    activation_phases = {name: {k: phases[name][k] for k in ("activations", "logits_and_loss", "comm_buffers")}
                         for name in ("loss", "layer")}
    return {"breakdown": breakdown, "peak_phase": peak_phase, "activation_phases": activation_phases,
            "allocated": allocated, "reserved": reserved,
            "stranded": res["stranded"], "device_total": device_total(reserved, communicators(spec)),
            "cpu_per_node": cpu["total_per_node"], "cpu_breakdown_per_node": cpu["breakdown"]}


def pinned_bytes(n: float) -> float:
    """Host bytes a pinned tensor of n bytes takes: torch's CachingHostAllocator rounds every pinned allocation up
    to the next power of two (ATen/core/CachingHostAllocator.h: `c10::llvm::PowerOf2Ceil(size)` while size is
    under pinned_max_round_threshold, by default every size)."""
    return float(2 ** math.ceil(math.log2(n))) if n > 0 else 0.0


def cpu_terms(spec, checkpoint_bytes: float, pinned: bool = True) -> dict:
    """Host memory per node: offloaded optimizer states, gradients and parameters (ZeRO-Offload, Ren et al. 2021;
    stage3.py pinned buffers), offloaded activation checkpoints (ALST), plus each process's own footprint.
    `pinned=False`: the sizes as allocated where nothing is pinned -- DeepSpeed's CPU accelerator keeps pin_memory a
    no-op (accelerator/cpu_accelerator.py), so CPU ranks hold the buffers at their own size."""
    m, N, z, B = spec.model, spec.world, spec.zero_stage, spec.dtype_bytes
    size = pinned_bytes if pinned else float
    psi_rank = m.total_params / (N if z >= 1 else 1)
    per_rank = {"optimizer": 0.0, "grads": 0.0, "params": 0.0, "checkpoints": checkpoint_bytes,
                "process": HOST_BYTES_PER_RANK}
    if spec.offload_optimizer:
        # offload keeps a fresh master copy on the host (fp32, or bf16 with bf16_optimizer_states)
        states = ADAM_BYTES_BF16_STATES if spec.bf16_optimizer_states else (
            ADAM_BYTES_MIXED if z == 3 else adam_bytes(z, B))
        # + the step's copy back in the training dtype on the host: ZeRO-3's blocking fp32 -> bf16 copy to the GPU
        # converts on the CPU into a pageable temporary of one sub group (aten/src/ATen/native/cuda/Copy.cu
        # copy_kernel_cuda; stage3.py _reassign_or_swap_out_partitioned_parameters; sub_group_size 1e9); ZeRO-1/2
        # keep a pinned one of the whole partition (stage_1_and_2.py param_buffer_of_bit16_for_cpu_offload_groups)
        # (ZeRO-3 in fp32 copies fp32 to fp32: no conversion, no temporary)
        if spec.bf16_optimizer_states or (z == 3 and B == 4):
            convert = 0.0
        else:
            convert = B * (min(psi_rank, SUB_GROUP_SIZE) if z == 3 else psi_rank)
        per_rank["optimizer"] = states * psi_rank + convert
        # master gradient partition the CPU optimizer reads (+ ZeRO-3's low-precision accumulation buffer on CPU)
        if z == 3:
            # stage3.py pins both (pin_memory true by default): grad_partitions_flat_buffer, one buffer for the
            # whole partition, and each sub group's master gradient (initialize_optimizer_states:
            # subgroup_gradient_buffer), each rounded up to a power of two by torch's pinned allocator
            groups = max(1, math.ceil(psi_rank / SUB_GROUP_SIZE))
            per_rank["grads"] = (groups * size(master_grad_bytes(spec) * psi_rank / groups)
                                 + size(B * psi_rank))
        else:
            per_rank["grads"] = master_grad_bytes(spec) * psi_rank
    if spec.offload_params:
        # stage3.py _create_param_groups_fp16_flat_cpu_memory: one pinned flat buffer of the rank's partition
        # (per parameter group; the small no-decay group left out), rounded up by torch's pinned allocator
        per_rank["params"] = size(B * m.total_params / N)
    r = spec.ranks_per_node
    return {"breakdown": {k: v * r for k, v in per_rank.items()}, "total_per_node": sum(per_rank.values()) * r}
