"""Step time, tokens/s, TFLOPS and MFU of one optimizer step (grad_accum micro batches), term by term.

step = compute + Ulysses all-to-all (synchronous, on the critical path) + ZeRO traffic not hidden behind compute
       + optimizer step (GPU, or the CPU under offload) + PCIe offload traffic not hidden behind compute.
tflops_per_gpu and mfu count model FLOPs (no recompute), as nanoGPT's estimate_mfu and torchtitan do.
"""
from __future__ import annotations

# Attained fraction of the dense bf16 peak for large GEMMs: cuBLAS on H100 SXM sustains ~700 of 989 TFLOPS and
# ~250 of 312 on A100 (NVIDIA's published GEMM figures); it falls for short token dimensions, modelled as
# m / (m + GEMM_HALF_TOKENS) (the tile-quantization / wave-quantization knee of cuBLAS at a few hundred rows).
GEMM_EFFICIENCY = 0.7
GEMM_HALF_TOKENS = 512
# Attention kernels' attained fraction of peak (causal, head_dim 128, long sequences):
# FlashAttention-2 reaches 50-73% of A100 peak fwd (Dao 2023) but only ~35% of H100 peak, because it does not use
# Hopper's wgmma/TMA; FlashAttention-3 reaches ~75% on H100 (Shah et al. 2024, fig. 5). torch SDPA dispatches to
# the FA2 kernel; eager attention is bandwidth bound.
ATTN_EFFICIENCY = {("flash_attention_2", "hopper"): 0.35, ("flash_attention_2", "ampere"): 0.6,
                   ("flash_attention_3", "hopper"): 0.6, ("flash_attention_3", "ampere"): 0.6,
                   ("sdpa", "hopper"): 0.35, ("sdpa", "ampere"): 0.55,
                   ("flex_attention", "hopper"): 0.3, ("flex_attention", "ampere"): 0.45,
                   ("eager", "hopper"): 0.15, ("eager", "ampere"): 0.2}
# Attention kernels lose efficiency on short sequences (fewer tiles per head, prologue/epilogue per block): FA2's
# fwd+bwd speed vs sequence length (Dao 2023, fig. 4-6) rises ~S / (S + 512) towards its plateau.
ATTN_HALF_SEQ = 512
# FlashAttention backward runs 5 matmuls to the forward's 2 (it recomputes the scores): 2.5x forward FLOPs.
ATTN_BWD_FACTOR = 2.5
# NCCL collectives reach about 80% of the per-direction link bandwidth at the message sizes involved
# (nccl-tests busbw on NVLink/InfiniBand).
LINK_EFFICIENCY = 0.8
# Effective pinned host<->device copy bandwidth per GPU: PCIe Gen5 x16 (H100/H200/B200) ~50 of 64 GB/s,
# PCIe Gen4 x16 (A100) ~25 of 32 GB/s.
PCIE_GB_PER_S = {"gen5": 50.0, "gen4": 25.0}
# THE ONE GLOBAL CALIBRATION CONSTANT: parameters per second, per node, that the CPU optimizer step processes
# under optimizer offload (ZeRO-Offload, Ren et al. 2021: the step runs on the host once per optimizer step, over
# every rank's fp32 partition; the GPUs wait for it). Datasheet DRAM bandwidth would suggest ~5e9/s, but the
# attained rate depends on the optimizer implementation (DeepSpeedCPUAdam vs torch's AdamW on CPU, which makes ~10
# passes over fp32 tensors), the cores each rank's process gets and NUMA placement, none of which a datasheet gives.
# Set once, globally, to minimize the worst tokens/s error over the HF blog's published Qwen3-4B rows (see
# bench/planner_accuracy.py); it is not adjusted per row or per model.
CPU_OPTIMIZER_PARAMS_PER_S = 0.27e9
# GPU Adam (optimizer on the GPU) streams the same ~30 bytes/param through HBM at ~80% of its bandwidth.
GPU_ADAM_BYTES_PER_PARAM = 30
HBM_EFFICIENCY = 0.8


def gpu_class(gpu) -> str:
    return "hopper" if gpu.bf16_dense_tflops >= 500 else "ampere"


def pcie_gb_per_s(gpu) -> float:
    return PCIE_GB_PER_S["gen5" if gpu.bf16_dense_tflops >= 500 else "gen4"]


def model_flops_per_token(m, seq_len: int) -> float:
    """Model FLOPs per trained token (forward + backward, no recompute): 6 per matmul weight a token multiplies
    (Kaplan et al. 2020; the lm_head counts, the embedding lookup does not; MoE: the routed experts only) plus
    causal attention 6 * L * a * d * S (PaLM appendix B's 12 * L * a * d * S, halved for the causal mask, which
    flash attention skips). The trainer counts its measured TFLOPS and MFU the same way (worker/trainer/metrics.py
    keeps its own copy, as it does not import the backend; a unit test holds the two equal), so the planner's
    prediction and the measurement on the run page are comparable."""
    return 6 * m.matmul_params + 6 * m.num_hidden_layers * m.num_attention_heads * m.head_dim * seq_len


def flops_per_token(spec) -> dict:
    """FLOPs per token. Model FLOPs: 6 per matmul parameter (Kaplan et al. 2020; Narayanan et al. 2021) plus
    causal attention 6 * L * a * d * S (PaLM appendix B, halved for the causal mask). Hardware FLOPs add the
    activation-checkpointing recompute (one more forward of every layer), TiledMLP's own recompute and the
    FlashAttention backward's score recompute."""
    m, S = spec.model, spec.seq_len
    L = m.num_hidden_layers
    fwd_layers_mm = 2 * L * m.layer_matmul_params
    fwd_head_mm = 2 * m.vocab_size * m.hidden_size
    fwd_attn = 2 * L * m.num_attention_heads * m.head_dim * S
    fwd_mlp = 2 * L * 3 * m.hidden_size * m.mlp_width
    model = model_flops_per_token(m, S)               # = 3 * (fwd_layers_mm + fwd_head_mm + fwd_attn)
    hw_mm = 3 * (fwd_layers_mm + fwd_head_mm)
    hw_attn = (1 + ATTN_BWD_FACTOR) * fwd_attn
    if spec.activation_checkpointing:
        hw_mm += fwd_layers_mm
        hw_attn += fwd_attn
    if spec.tiled_mlp:
        hw_mm += fwd_mlp
    return {"model": model, "hw_matmul": hw_mm, "hw_attention": hw_attn}


def _link_time(spec, nbytes_per_rank: float, group: int) -> float:
    """Seconds to move nbytes out of each rank in a collective over `group` ranks laid out contiguously: the share
    going to ranks on the same node crosses NVLink, the rest the inter-node link (per GPU, one direction)."""
    if group <= 1 or nbytes_per_rank <= 0:
        return 0.0
    g = spec.gpu
    local = min(group, spec.ranks_per_node)
    frac_local = (local - 1) / (group - 1)
    bw_local = g.nvlink_gb_per_s_per_direction * 1e9 * LINK_EFFICIENCY
    bw_remote = g.typical_internode_gb_per_s * 1e9 * LINK_EFFICIENCY
    return nbytes_per_rank * (frac_local / bw_local + (1 - frac_local) / bw_remote)


def estimate_throughput(spec) -> dict:
    m, g, B, t, ga, N, sp = spec.model, spec.gpu, spec.dtype_bytes, spec.local_tokens, spec.grad_accum, spec.world, spec.sp
    fl = flops_per_token(spec)
    peak = g.bf16_dense_tflops * 1e12 * (0.5 if spec.dtype == "fp32" else 1.0)  # fp32 runs as TF32 at half rate
    eta_mm = GEMM_EFFICIENCY * t / (t + GEMM_HALF_TOKENS)
    eta_attn = ATTN_EFFICIENCY[(spec.attn, gpu_class(g))] * spec.seq_len / (spec.seq_len + ATTN_HALF_SEQ)
    compute_micro = t * (fl["hw_matmul"] / (peak * eta_mm) + fl["hw_attention"] / (peak * eta_attn))
    compute = ga * compute_micro

    # Ulysses: 4 all-to-alls per layer each way (q, k, v in; attention output back), DeepSpeed ulysses_sp.py;
    # forward, recompute forward and backward. Each rank keeps 1/sp of its buffer.
    a2a = 0.0
    if sp > 1:
        kv_eff = max(m.num_key_value_heads, sp)
        per_layer = B * t * (2 * m.q_dim + 2 * kv_eff * m.head_dim) * (sp - 1) / sp
        passes = 3 if spec.activation_checkpointing else 2
        a2a = ga * passes * m.num_hidden_layers * _link_time(spec, per_layer, sp)

    # ZeRO traffic per rank (ZeRO paper sec. 7: stage 3 moves 3x the parameters per step vs 2x for DP).
    psi, z = m.total_params, spec.zero_stage
    comm_b = 4 if sp > 1 else B                      # seq_parallel_communication_data_type = fp32 when sp > 1
    shard = (N - 1) / N
    if z == 3:
        gathers = 3 if spec.activation_checkpointing else 2
        per_micro = _link_time(spec, (gathers * B + comm_b) * psi * shard, N)
        zero_exposed = ga * max(0.0, per_micro - compute_micro)
        zero_total = ga * per_micro
    elif z == 2:
        per_micro = _link_time(spec, comm_b * psi * shard, N)
        after = _link_time(spec, B * psi * shard, N)
        zero_exposed = ga * max(0.0, per_micro - compute_micro) + after
        zero_total = ga * per_micro + after
    else:
        zero_total = zero_exposed = _link_time(spec, (2 * comm_b + (B if z == 1 else 0)) * psi * shard, N)

    # Optimizer step and offload traffic over PCIe (DeepSpeed stage3.py `partition_grads`: with optimizer offload
    # every micro batch copies its gradient partition to the pinned CPU buffer and, after the first, brings the
    # running sum back to add on the GPU; at the boundary the fp32 gradients go down and the updated low-precision
    # parameters come back up). Copies are non_blocking on pinned memory, so per-micro-batch traffic hides behind
    # that micro batch's compute; only the excess is exposed. The boundary copies and the CPU step are not hidden.
    psi_rank = psi / (N if z >= 1 else 1)
    pcie = pcie_gb_per_s(g) * 1e9
    per_micro = 0.0
    boundary = 0.0
    if spec.offload_optimizer:
        optimizer = psi_rank * spec.ranks_per_node / CPU_OPTIMIZER_PARAMS_PER_S
        per_micro += (2 * B * psi_rank if z == 3 else B * psi_rank) / pcie
        boundary += (4 + B) * psi_rank / pcie
    else:
        optimizer = psi_rank * GPU_ADAM_BYTES_PER_PARAM / (g.hbm_tb_per_s * 1e12 * HBM_EFFICIENCY)
    if spec.offload_params:                            # ZeRO-Infinity: parameters come up for every gather
        per_micro += (3 if spec.activation_checkpointing else 2) * B * psi_rank / pcie
    if spec.checkpoint_offload:                        # ALST: checkpoints down in forward, back up in backward
        per_micro += 2 * m.num_hidden_layers * B * m.hidden_size * t / pcie
    offload = ga * max(0.0, per_micro - compute_micro) + boundary

    step = compute + a2a + zero_exposed + optimizer + offload
    tokens = spec.seq_len * spec.micro_batch_size * ga * spec.dp
    tflops = fl["model"] * tokens / N / step / 1e12
    return {"step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / N,
            "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / peak,
            "time_breakdown_s": {"compute": compute, "all_to_all": a2a, "zero_comm": zero_exposed,
                                 "optimizer_step": optimizer, "offload_transfers": offload},
            "zero_comm_total_s": zero_total}
