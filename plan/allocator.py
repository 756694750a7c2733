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
# - CUDA context with lazy module loading, cuBLAS/cuDNN handles: about 0.5 GiB per process on H100 / CUDA 12.
CUDA_CONTEXT_BYTES = 0.5 * GIB
# - NCCL: each communicator allocates NCCL_BUFFSIZE (4 MiB) per channel for send and receive on every ring/tree
#   and p2p channel, outside the caching allocator; about 0.25 GiB per communicator on NVLink systems.
NCCL_BYTES_PER_COMMUNICATOR = 0.25 * GIB


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
