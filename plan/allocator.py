"""The CUDA caching allocator's reserved peak (`torch.cuda.max_memory_reserved`) from a step's phases, and what
`nvidia-smi` shows on top of it. Replaces a flat fragmentation share: the gap between reserved and allocated comes
from the sizes of the step's largest transient tensors, not from a percentage of everything.

How PyTorch's allocator behaves (c10/cuda/CUDACachingAllocator.cpp):
- A request over 1 MiB comes from the large pool. A freed block stays cached in its segment ("reserved"); a later
  request takes the smallest cached free block that fits (best fit) and splits it. Blocks never move, and a
  segment goes back to the driver only when it is wholly free, and only when a cudaMalloc fails (the allocator
  then releases every wholly free cached segment and retries) or on empty_cache().
- So a phase whose largest tensors are smaller than the largest block an earlier phase freed (the fp32 logits
  of the loss, say) carves its tensors out of that block; once one of them lives there the segment cannot be
  released, and whatever of the block the phase does not fill stays reserved: "stranded".
- With `expandable_segments:True` a stream's memory is one virtual range mapped page by page (2 MiB pages); free
  pages anywhere in it are unmapped when memory runs short, so nothing stays stranded beyond page rounding.

Model: the step's largest transient block T_1 is freed and requested again every layer or micro batch. Between the
two, best fit hands it to the next-largest request class T_2 whenever that class finds no free block of its own size
(it is the smallest free block that fits), and splits it. When T_1 is requested again while the T_2 piece lives, it
needs a new segment; the old segment's remainder T_1 - T_2 stays reserved, unusable for T_1 and unreleasable while
its segment holds a live block: "stranded". So without expandable segments the reserved peak is the allocated peak
plus S = T_1 - T_2 (the sizes taken over every phase's transient blocks); with them S = 0. Rounding each large block
up to the allocator's 2 MiB granule (kRoundLarge) adds under 2 MiB per live block, a few tens of MiB for a step's few
dozen large tensors: left out.
"""
from __future__ import annotations

GIB = 2 ** 30
# What `nvidia-smi` shows on top of the allocator's reserved memory (plan-v1 `device_total_gib`):
# - the CUDA context of a training process (driver context, the kernels torch, flash-attn and Triton load, cuBLAS
#   and cuDNN handles): measured on one H100 80GB HBM3 (torch 2.11 / CUDA 13.0, one GPU, no NCCL communicator) as
#   nvidia-smi's peak minus torch.cuda.max_memory_reserved, 1.677-1.708 GiB over the 8 runs of
#   bench/results/gpu-nvidia-h100-80gb-hbm3-2026-11-27.csv where nvidia-smi's peak sample is at or above the
#   allocator's peak (bench/gpu_check.py; the median, 1.679 GiB, rounded up).
CUDA_CONTEXT_BYTES = 1.68 * GIB
# - NCCL's buffers, outside the caching allocator: per channel, a rank's ring connections (receive from the previous
#   rank, send to the next) each hold one SIMPLE-protocol buffer of NCCL_BUFFSIZE (NCCL's documented default,
#   4 MiB) on this rank; NCCL_CHANNELS is NCCL's channel limit (MAXCHANNELS, 32), the count it opens on NVLink-rich
#   nodes -> 32 x 2 x 4 MiB = 0.25 GiB per communicator. Tree, LL/LL128 and NVLS buffers are left out. Unmeasured:
#   the H100 measurement above ran one GPU, without a communicator.
NCCL_BUFFSIZE = 4 * 2 ** 20
NCCL_CHANNELS = 32
NCCL_BYTES_PER_COMMUNICATOR = NCCL_CHANNELS * 2 * NCCL_BUFFSIZE


def stranded(blocks: list[float], expandable: bool) -> float:
    """Bytes reserved but unusable at the peak (module docstring): the largest transient block less the next
    smaller block size, none with expandable segments."""
    sizes = sorted({b for b in blocks if b > 0}, reverse=True)
    if expandable or not sizes:
        return 0.0
    return sizes[0] - (sizes[1] if len(sizes) > 1 else 0.0)


def reserved_peak(allocated: float, blocks: list[float], expandable: bool) -> dict:
    """The allocator's reserved peak for a step whose allocated peak is `allocated` and whose transient tensors
    (every phase's) have the sizes `blocks`."""
    s = stranded(blocks, expandable)
    return {"reserved": allocated + s, "stranded": s}


def device_total(reserved: float, communicators: int) -> float:
    """What nvidia-smi shows for a rank: the allocator's reserved bytes, the CUDA context and NCCL's buffers."""
    return reserved + CUDA_CONTEXT_BYTES + NCCL_BYTES_PER_COMMUNICATOR * communicators
