"""Step time, tokens/s, TFLOPS and MFU of one optimizer step (grad_accum micro batches), term by term.

step = compute (matmuls, attention, the memory-bound elementwise work: plan/membound.py)
       + Ulysses all-to-all (synchronous, on the critical path: bandwidth and a latency per call)
       + ZeRO traffic not hidden behind compute (ZeRO-3's prefetch overlaps one layer ahead, not the whole pass)
       + the host time the device waits for (plan/host.py: measured per layer and micro batch)
       + optimizer step (GPU, or the CPU under offload) + PCIe offload traffic not hidden behind compute.
tflops_per_gpu and mfu count model FLOPs (no recompute), as nanoGPT's estimate_mfu and torchtitan do.
"""
from __future__ import annotations

from . import host
from .membound import HBM_EFFICIENCY, memory_bound_s
from .memory import grad_comm_bytes

# Attained fraction of the dense bf16 peak for large GEMMs: cuBLAS on H100 SXM sustains ~700 of 989 TFLOPS and
# ~250 of 312 on A100 (NVIDIA's published GEMM figures); it falls for short token dimensions, modelled as
# m / (m + GEMM_HALF_TOKENS) (the tile-quantization / wave-quantization knee of cuBLAS at a few hundred rows).
GEMM_EFFICIENCY = 0.7
GEMM_HALF_TOKENS = 512
# Attention kernels' attained fraction of peak (causal, head_dim 128, long sequences):
# FlashAttention-2 reaches 50-73% of A100 peak fwd (Dao 2023) but only ~35% of H100 peak, because it does not use
# Hopper's wgmma/TMA; FlashAttention-3 reaches ~75% on H100 (Shah et al. 2024, fig. 5). torch SDPA dispatches to
# the FA2 kernel on Ampere; on Hopper it prefers cuDNN's fused attention (torch/backends/cuda `cudnn_sdp_enabled`;
# sdp_utils' priority order puts cuDNN first on sm90), which runs at FlashAttention-3's level (Shah et al. 2024,
# fig. 5-6 plot cuDNN beside FA3 on H100): the FA3 figure. Eager attention is bandwidth bound.
ATTN_EFFICIENCY = {("flash_attention_2", "hopper"): 0.35, ("flash_attention_2", "ampere"): 0.6,
                   ("flash_attention_3", "hopper"): 0.6, ("flash_attention_3", "ampere"): 0.6,
                   ("sdpa", "hopper"): 0.6, ("sdpa", "ampere"): 0.55,
                   ("flex_attention", "hopper"): 0.3, ("flex_attention", "ampere"): 0.45,
                   ("eager", "hopper"): 0.15, ("eager", "ampere"): 0.2}
# Attention kernels lose efficiency on short sequences (fewer tiles per head, prologue/epilogue per block): FA2's
# fwd+bwd speed vs sequence length (Dao 2023, fig. 4-6) rises ~S / (S + 512) towards its plateau.
ATTN_HALF_SEQ = 512
# The attention kernels' efficiency grows with head_dim (more work per loaded tile): FlashAttention-3's bf16 causal
# forward at 16K on H100 runs at about 0.75x head_dim 128's TFLOPS with head_dim 64 and about 1.15x with 256 (Shah et
# al. 2024, fig. 5; FlashAttention-2 on A100 shows the same ordering, Dao 2023, fig. 4-6): d / (d + 64) relative to
# 128 gives 0.75 and 1.2. ATTN_EFFICIENCY is the head_dim-128 figure.
ATTN_HEAD_DIM_HALF = 64
ATTN_REFERENCE_HEAD_DIM = 128
# FlashAttention backward runs 5 matmuls to the forward's 2 (it recomputes the scores): 2.5x forward FLOPs.
ATTN_BWD_FACTOR = 2.5
# NCCL collectives reach about 80% of the per-direction link bandwidth at the message sizes involved
# (nccl-tests busbw on NVLink/InfiniBand).
LINK_EFFICIENCY = 0.8
# Latency of one NCCL transfer step, seconds: NCCL's own cost model (src/graph/tuning.cc) charges the Simple
# protocol a base latency of 8.4 us plus 3.4 us per NVLink hop or 14 us per network hop. An all-to-all sends to every
# peer at once, so a call costs one step, the network's when the group spans nodes.
NCCL_BASE_LATENCY_S = 8.4e-6
NCCL_HOP_LATENCY_S = {"nvlink": 3.4e-6, "net": 14.0e-6}
# Every Ulysses attention runs 4 all-to-alls per pass (q, k and v in, the output back: DeepSpeed ulysses_sp.py
# UlyssesSPAttentionHF.forward), and their gradients 4 in the backward.
A2A_CALLS_PER_LAYER_PASS = 4
# Effective pinned host<->device copy bandwidth per GPU: PCIe Gen5 x16 (H100/H200/B200) ~50 of 64 GB/s,
# PCIe Gen4 x16 (A100) ~25 of 32 GB/s.
PCIE_GB_PER_S = {"gen5": 50.0, "gen4": 25.0}
# The optimizer step under offload is the CPU's, one sub group after another and blocking (DeepSpeed 0.19.8
# runtime/zero/stage3.py `step`: _prepare_sub_group, unscale_and_clip_grads, _optimizer_step,
# _reassign_or_swap_out_partitioned_parameters, _release_sub_group; stage_1_and_2.py's step does the same passes on
# its fp32 partition, converting into a pinned bf16 buffer on the CPU: `bit16_partition_buffer.data.copy_(
# fp32_partition.data)`). Per parameter, bytes the CPU streams through memory:
# - unscale_and_clip_grads: `fp32_partitioned_groups_flat[i].grad.mul_(1. / combined_scale)` on the CPU: 4 read + 4
#   written (2 + 2 with bf16 master gradients);
# - DeepSpeedCPUAdam (ops/csrc/includes/cpu_adam.h Step_AVX): parameter, gradient, exp_avg and exp_avg_sq read,
#   parameter and both moments written: 16 + 12 = 28 (14 with bf16 master weights and moments,
#   `bf16_optimizer_states`);
# - the copy back: `fp16_partitioned_groups_flat[i].data.copy_(fp32_partitioned_groups_flat[i].data)` is a
#   blocking CPU->GPU copy with a dtype change, which torch converts on the CPU (aten/src/ATen/native/cuda/Copy.cu
#   copy_kernel_cuda: "For blocking transfers conversions are performed on CPU"; PyTorch's repository source, the
#   wheel ships no .cu, and no GPU here to time it): 4 read + 2 written (no
#   conversion when the master weights are already bf16); the bf16 bytes then cross PCIe (the boundary copies).
CPU_STEP_BYTES_PER_PARAM = {"fp32": 8 + 28 + 6, "bf16": 4 + 14 + 0}
ADAM_CPU_BYTES_PER_PARAM = 28
# DeepSpeedCPUAdam on one core (one OpenMP thread), parameters per second: bench/cpu_adam.py (fp32 partitions as
# ZeRO-Offload hands them, 50M parameters, median of 5 steps) measured 0.647e9 with one thread on this project's
# 2-core machine under load (load average 12, niced), and 0.40-1.07e9 per core in earlier runs; two threads gave
# 0.378e9 per core (the channels are shared). The step is bound by the core's memory bandwidth (28 B/param:
# ~18 GB/s). The one-thread figure is used.
CPU_ADAM_PARAMS_PER_S_PER_CORE = 0.65e9
# The node's memory bandwidth caps the sum over its cores: ZeRO-Offload (Ren et al., USENIX ATC 2021), Table 2:
# CPU-Adam updates 1B parameters in 0.22 s and 10B in 2.57 s on a DGX-2's two 24-core Xeon Platinum 8168, about
# 4e9 parameters/s per node at 28 B each (~112 GB/s).
CPU_OPTIMIZER_PARAMS_PER_S = 4.0e9
# GPU Adam (optimizer on the GPU) streams through HBM at ~80% of its bandwidth: fp32 master read and written (8 B),
# both moments read and written (16), the fp32 gradient read (4), the bf16 parameter written (2) = 30 B/param; with
# bf16 master weights, gradients and moments (`bf16_optimizer_states`) 4 + 8 + 2 + 2 = 16.
GPU_ADAM_BYTES_PER_PARAM = {"fp32": 30, "bf16": 16}


def gpu_class(gpu) -> str:
    return "hopper" if gpu.bf16_dense_tflops >= 500 else "ampere"


def cpu_threads_per_rank(spec) -> int:
    """OpenMP threads DeepSpeedCPUAdam (and torch's CPU ops) get per rank. torchrun with several ranks per node and
    `accelerate launch` set OMP_NUM_THREADS=1 when it is unset (torch/distributed/run.py: "Setting OMP_NUM_THREADS
    environment variable for each process to be 1 in default", under `nproc_per_node > 1`;
    accelerate/commands/launch.py: num_cpu_threads_per_process defaults to OMP_NUM_THREADS or 1), so without
    `hardware.cpu_cores_per_node` a rank steps on one core. Ulysses Lab's trainer gives each rank
    cores // ranks_on_node (worker/trainer/collectives.py share_cores). DeepSpeed's launcher sets no thread count
    (launcher/launch.py, only under --bind_cores_to_rank) and a lone torchrun rank keeps torch's default: all the
    node's cores; the one-core reading is kept for them too (docs/planner-accuracy.md, step-time misses)."""
    cores = spec.plan.hardware.cpu_cores_per_node
    return 1 if cores is None else max(1, cores // spec.ranks_per_node)


def cpu_cores_per_rank(spec) -> float:
    """Cores a rank's threads actually run on: its threads, or its share when a node has fewer cores than ranks
    (then every rank has one thread and they take turns)."""
    cores = spec.plan.hardware.cpu_cores_per_node
    threads = cpu_threads_per_rank(spec)
    return float(threads) if cores is None else min(float(threads), cores / spec.ranks_per_node)


def cpu_optimizer_step_s(spec, psi_rank: float) -> float:
    """Seconds of the CPU optimizer step under offload (CPU_STEP_BYTES_PER_PARAM): every rank of a node steps its
    partition at once, each on its own threads, at a core's bandwidth per thread, all capped by the node's."""
    states = "bf16" if spec.bf16_optimizer_states else "fp32"
    core_bw = CPU_ADAM_PARAMS_PER_S_PER_CORE * ADAM_CPU_BYTES_PER_PARAM
    node_bw = CPU_OPTIMIZER_PARAMS_PER_S * ADAM_CPU_BYTES_PER_PARAM
    per_rank_bw = min(cpu_cores_per_rank(spec) * core_bw, node_bw / spec.ranks_per_node)
    return psi_rank * CPU_STEP_BYTES_PER_PARAM[states] / per_rank_bw


def pcie_gb_per_s(gpu) -> float:
    return PCIE_GB_PER_S["gen5" if gpu.bf16_dense_tflops >= 500 else "gen4"]


def attention_len(spec) -> int:
    """Tokens each token attends over on average x 2: the sequence, or with packed documents (`document_len`) the
    document, since attention stops at document boundaries (flash-attn varlen / position_ids reset)."""
    d = spec.document_len
    return spec.seq_len if d is None else min(d, spec.seq_len)


def flops_per_token(spec, attn_len: int | None = None) -> dict:
    """FLOPs per token. Model FLOPs: 6 per matmul parameter (Kaplan et al. 2020; Narayanan et al. 2021) plus
    causal attention 6 * L * a * d * S (PaLM appendix B, halved for the causal mask), S the attention length
    (`attention_len`: the document when sequences are packed). Hardware FLOPs add the activation-checkpointing
    recompute (one more forward of every layer), TiledMLP's own recompute and the FlashAttention backward's score
    recompute."""
    m, S = spec.model, attn_len or attention_len(spec)
    L = m.num_hidden_layers
    fwd_layers_mm = 2 * L * m.layer_matmul_params
    fwd_head_mm = 2 * m.vocab_size * m.hidden_size
    fwd_attn = 2 * L * m.num_attention_heads * m.head_dim * S
    fwd_mlp = 2 * L * 3 * m.hidden_size * m.mlp_width
    model = m.flops_per_token(S)                      # = 3 * (fwd_layers_mm + fwd_head_mm + fwd_attn)
    hw_mm = 3 * (fwd_layers_mm + fwd_head_mm)
    hw_attn = (1 + ATTN_BWD_FACTOR) * fwd_attn
    if spec.activation_checkpointing:
        hw_mm += fwd_layers_mm
        hw_attn += fwd_attn
    if spec.tiled_mlp:
        hw_mm += fwd_mlp
    return {"model": model, "hw_matmul": hw_mm, "hw_attention": hw_attn, "hw_matmul_head": 3 * fwd_head_mm}


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


def _call_latency(spec, group: int) -> float:
    """Seconds of one collective call's latency over `group` contiguous ranks (NCCL_*_LATENCY_S)."""
    if group <= 1:
        return 0.0
    hop = "net" if group > spec.ranks_per_node else "nvlink"
    return NCCL_BASE_LATENCY_S + NCCL_HOP_LATENCY_S[hop]


def attention_efficiency(spec, block: int) -> float:
    """Attained fraction of peak of the attention kernel on blocks of `block` tokens: the kernel's head_dim-128
    figure, scaled by head_dim (ATTN_HEAD_DIM_HALF) and by the block's length (ATTN_HALF_SEQ)."""
    d = spec.model.head_dim
    by_head_dim = (d / (d + ATTN_HEAD_DIM_HALF)) / (ATTN_REFERENCE_HEAD_DIM / (ATTN_REFERENCE_HEAD_DIM
                                                                                + ATTN_HEAD_DIM_HALF))
    return ATTN_EFFICIENCY[(spec.attn, gpu_class(spec.gpu))] * by_head_dim * block / (block + ATTN_HALF_SEQ)


def estimate_throughput(spec, attn_len: int | None = None, attn_block: int | None = None) -> dict:
    """`attn_len` / `attn_block` (plan.ring): the sequence attended over and the length of the blocks the attention
    kernel runs on, when a rank sees less of the sequence than it attends over (ring attention); both default to
    the plan's attention length."""
    m, g, B, t = spec.model, spec.gpu, spec.dtype_bytes, spec.local_tokens
    ga, N, sp, L = spec.grad_accum, spec.world, spec.sp, m.num_hidden_layers
    S_attn = attn_len or attention_len(spec)
    fl = flops_per_token(spec, S_attn)
    peak = g.peak_flops(spec.dtype)
    eta_mm = GEMM_EFFICIENCY * t / (t + GEMM_HALF_TOKENS)
    eta_attn = attention_efficiency(spec, min(attn_block or S_attn, S_attn))
    mem_bound = memory_bound_s(spec)
    layers_micro = (t * ((fl["hw_matmul"] - fl["hw_matmul_head"]) / (peak * eta_mm) + fl["hw_attention"]
                         / (peak * eta_attn)) + L * mem_bound["layer"])
    compute_micro = layers_micro + t * fl["hw_matmul_head"] / (peak * eta_mm) + mem_bound["loss"]
    compute = ga * compute_micro

    # Ulysses: 4 all-to-alls per layer each way (q, k, v in; attention output back), DeepSpeed ulysses_sp.py;
    # forward, recompute forward and backward. Each rank keeps 1/sp of its buffer.
    a2a_micro = 0.0
    passes = 3 if spec.activation_checkpointing else 2
    if sp > 1:
        kv_eff = max(m.num_key_value_heads, sp)
        per_layer = B * t * (2 * m.q_dim + 2 * kv_eff * m.head_dim) * (sp - 1) / sp
        a2a_micro = passes * L * (_link_time(spec, per_layer, sp)
                                  + A2A_CALLS_PER_LAYER_PASS * _call_latency(spec, sp))
    a2a = ga * a2a_micro

    # ZeRO traffic per rank (ZeRO paper sec. 7: stage 3 moves 3x the parameters per step vs 2x for DP).
    psi, z = m.total_params, spec.zero_stage
    comm_b = grad_comm_bytes(spec)                   # seq_parallel_communication_data_type when sp > 1
    shard = (N - 1) / N
    if z == 3:
        # ZeRO-3 prefetches stage3_prefetch_bucket_size = 0.9 h^2 parameters ahead (Transformers' "auto",
        # plan/memory.py zero3_live_bytes), less than a layer's 12 h^2 or more: a layer's gathers and its gradients'
        # reduce-scatter overlap the neighbouring layer's compute only, and the first layer's gather of each pass
        # has nothing before it to hide behind. The embedding and lm_head are spread over the layers, which are
        # alike: the per-layer excess summed over L layers is the whole pass's excess over the layers' compute
        # (not over the lm_head's and the loss's, which no gather overlaps).
        zero_total = ga * _link_time(spec, (passes * B + comm_b) * psi * shard, N)
        first = passes * _link_time(spec, B * psi / L * shard, N)
        zero_exposed = ga * first + max(0.0, zero_total - ga * layers_micro)
    elif z == 2:
        per_micro = _link_time(spec, comm_b * psi * shard, N)
        after = _link_time(spec, B * psi * shard, N)
        zero_exposed = ga * max(0.0, per_micro - compute_micro) + after
        zero_total = ga * per_micro + after
    else:
        zero_total = zero_exposed = _link_time(spec, (2 * comm_b + (B if z == 1 else 0)) * psi * shard, N)

    # The host: each layer (ZeRO-3) or the whole micro batch (else) takes at least the host's time to issue it.
    device_layer = (layers_micro + a2a_micro) / L
    host_exposed = host.exposed_s(spec, device_layer, compute_micro + a2a_micro)

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
        optimizer = cpu_optimizer_step_s(spec, psi_rank)
        per_micro += (2 * B * psi_rank if z == 3 else B * psi_rank) / pcie
        master_grad = 2 if spec.bf16_optimizer_states else 4      # the master gradients' dtype goes down
        boundary += (master_grad + B) * psi_rank / pcie
    else:
        states = "bf16" if spec.bf16_optimizer_states else "fp32"
        optimizer = psi_rank * GPU_ADAM_BYTES_PER_PARAM[states] / (g.hbm_tb_per_s * 1e12 * HBM_EFFICIENCY)
    # the engine's loop over its parameter groups: on the host, before or around the device's (or CPU's) update
    host_optimizer = host.optimizer_s(spec)
    if spec.offload_optimizer:
        host_exposed += host_optimizer
    else:
        host_exposed += max(0.0, host_optimizer - optimizer)
    if spec.offload_params:                            # ZeRO-Infinity: parameters come up for every gather
        per_micro += (3 if spec.activation_checkpointing else 2) * B * psi_rank / pcie
    if spec.checkpoint_offload:                        # ALST: checkpoints down in forward, back up in backward
        per_micro += 2 * m.num_hidden_layers * B * m.hidden_size * t / pcie
    offload = ga * max(0.0, per_micro - compute_micro) + boundary

    step = compute + a2a + zero_exposed + host_exposed + optimizer + offload
    tokens = spec.seq_len * spec.sequences_per_step
    tflops = fl["model"] * tokens / N / step / 1e12
    return {"step_time_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_gpu": tokens / step / N,
            "tflops_per_gpu": tflops, "mfu": tflops * 1e12 / peak,
            "time_breakdown_s": {"compute": compute, "all_to_all": a2a, "zero_comm": zero_exposed,
                                 "host_overhead": host_exposed, "optimizer_step": optimizer,
                                 "offload_transfers": offload},
            "zero_comm_total_s": zero_total}
