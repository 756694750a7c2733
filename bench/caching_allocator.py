"""PyTorch's CUDA caching allocator, replayed in Python over a sequence of allocations and frees: its segments,
blocks, pools and peaks (bench/allocator_replay.py feeds it a traced step, a whole CPU run or a GPU run's own
trace).

The allocator's rules (torch 2.13 on this machine):
- Constants, read in torch/include/c10/core/AllocatorConfig.h: kMinBlockSize = 512 (every request is rounded up to
  a multiple of it), kSmallSize = 1 MiB (requests up to it use the small pool), kSmallBuffer = 2 MiB (a small-pool
  segment), kMinLargeAlloc = 10 MiB (its comment: "allocations between 1 and 10 MiB may use kLargeBuffer"),
  kRoundLarge = 2 MiB (larger requests get a segment rounded up to a multiple of it). kLargeBuffer = 20 MiB itself
  is defined in CUDACachingAllocator.cpp, not on this machine.
- The same header: max_split_size_ defaults to std::numeric_limits<size_t>::max() (unlimited) and
  use_expandable_segments_ to false (PYTORCH_CUDA_ALLOC_CONF changes them). c10/cuda/CUDACachingAllocator.h:
  segments are per stream and per pool (SegmentInfo.stream, is_small_pool).
- CUDACachingAllocator.cpp is NOT on this machine (the wheel ships headers only); the algorithm below is as that
  file implements it in torch 2.x, from its published source, not re-read here:
  - round_size: max(kMinBlockSize, the size rounded up to kMinBlockSize) (roundup_power2_divisions off by default).
  - get_pool: size <= kSmallSize -> small pool, else large pool; each pool's free blocks are ordered by
    (stream, size, address) and get_free_block takes the first at or above (stream, size): the smallest cached
    free block of the same pool and stream that fits, the lowest address among equals (best fit).
  - get_allocation_size: <= kSmallSize -> kSmallBuffer; < kMinLargeAlloc -> kLargeBuffer; else rounded up to
    kRoundLarge. No free block fits -> cudaMalloc of that size: a new segment.
  - should_split: remaining = block size - request; small pool: remaining >= kMinBlockSize; large pool: remaining
    > kSmallSize. The request takes the block's start, the remainder becomes a free block after it. Unsplit, the
    whole block is handed out and counted as allocated (allocated_bytes counts block sizes, as
    max_memory_allocated reports them).
  - free_block: the block merges with its free neighbours in the segment (prev and next) and returns to its pool.
  - a segment goes back to the driver only when it is wholly free and a cudaMalloc fails (release_cached_blocks)
    or on empty_cache(): never within a step that does not run out of memory, so the traced steps' replay
    releases nothing (the H100 rows reserved at most 50 of 80 GiB); in a recorded GPU trace (`--snapshot`) a run
    of segment_free entries is replayed as empty_cache().
  - with max_split_size unlimited, every block may be split and served from (the oversize rules do not apply).
- Left out: segment addresses (a new segment is given a higher address than every earlier one; cudaMalloc does not
  promise that, and the order only breaks ties between equal-size free blocks), CUDA events of blocks used on
  another stream (record_stream), the CUDA-graph private pools. The FakeTensor step trace (not `--record-cpu`)
  also leaves out ZeRO-3's gathers on their own stream (one stream is traced; a recorded GPU trace keeps each
  allocation's stream), the optimizer step's kernels' temporaries and everything before the first step (the
  model's build, DeepSpeed's initialisation).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

GIB = 2 ** 30
MIB = 2 ** 20
# torch/include/c10/core/AllocatorConfig.h (torch 2.13); K_LARGE_BUFFER from CUDACachingAllocator.cpp (docstring)
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_MIN_LARGE_ALLOC = 10 * MIB
K_LARGE_BUFFER = 20 * MIB
K_ROUND_LARGE = 2 * MIB


def round_size(size: int) -> int:
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def allocation_size(size: int) -> int:
    """cudaMalloc size of a new segment for a request of `size` (already rounded) bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def is_small(size: int) -> bool:
    return size <= K_SMALL_SIZE


@dataclass(eq=False)
class Block:
    segment: int
    offset: int
    size: int
    small: bool
    stream: int
    allocated: bool = False
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    def key(self) -> tuple[int, int, int, int]:
        return (self.stream, self.size, self.segment, self.offset)


class CachingAllocator:
    """The caching allocator's block bookkeeping (module docstring), without memory: sizes and addresses only."""

    def __init__(self) -> None:
        self.pools: dict[bool, list[tuple[tuple[int, int, int, int], Block]]] = {True: [], False: []}
        self.segments: list[int] = []  # segment sizes, by segment id (creation order = address order)
        self.allocated = 0
        self.reserved = 0
        self.peak_allocated = 0
        self.peak_reserved = 0

    def _insert(self, block: Block) -> None:
        bisect.insort(self.pools[block.small], (block.key(), block), key=lambda e: e[0])

    def _remove(self, block: Block) -> None:
        pool = self.pools[block.small]
        i = bisect.bisect_left(pool, block.key(), key=lambda e: e[0])
        assert pool[i][1] is block
        del pool[i]

    def _best_fit(self, size: int, small: bool, stream: int) -> Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (stream, size, -1, -1), key=lambda e: e[0])
        if i < len(pool) and pool[i][1].stream == stream:
            return pool[i][1]
        return None

    def malloc(self, nbytes: int, stream: int = 0) -> Block:
        size = round_size(nbytes)
        small = is_small(size)
        block = self._best_fit(size, small, stream)
        if block is not None:
            self._remove(block)
        else:
            seg = allocation_size(size)
            block = Block(len(self.segments), 0, seg, small, stream)
            self.segments.append(seg)
            self.reserved += seg
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        remaining = block.size - size
        if remaining >= K_MIN_BLOCK_SIZE if small else remaining > K_SMALL_SIZE:
            rest = Block(block.segment, block.offset + size, remaining, small, stream, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._insert(rest)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        assert block.allocated
        block.allocated = False
        self.allocated -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is None or neighbour.allocated:
                continue
            self._remove(neighbour)
            if neighbour is block.prev:
                block.offset, block.prev = neighbour.offset, neighbour.prev
                if neighbour.prev is not None:
                    neighbour.prev.next = block
            else:
                block.next = neighbour.next
                if neighbour.next is not None:
                    neighbour.next.prev = block
            block.size += neighbour.size
        self._insert(block)


    def reset_peaks(self) -> None:
        """torch.cuda.reset_peak_memory_stats: the peaks start again from the current bytes."""
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def empty_cache(self) -> None:
        """Release every wholly free segment (empty_cache(), or release_cached_blocks after a failed cudaMalloc)."""
        for small in (True, False):
            for _, block in list(self.pools[small]):
                if block.prev is None and block.next is None:
                    self._remove(block)
                    self.reserved -= block.size


# ("alloc", id, bytes[, stream]) / ("free", id, 0) / ("empty_cache", 0, 0); the stream is 0 unless given
Event = tuple[str, int, int] | tuple[str, int, int, int]


def replay(events: list[Event], steps: int = 1) -> CachingAllocator:
    """Replay an allocation sequence `steps` times into one allocator; storages still live at the end of a pass
    (none, for a whole step) are freed before the next one."""
    alloc = CachingAllocator()
    for _ in range(steps):
        live: dict[int, Block] = {}
        for kind, key, nbytes, *stream in events:
            if kind == "alloc":
                live[key] = alloc.malloc(nbytes, *stream)
            elif kind == "empty_cache":
                alloc.empty_cache()
            elif key in live:
                alloc.free(live.pop(key))
        for block in live.values():
            alloc.free(block)
    return alloc


def replay_steps(events: list[Event]) -> list[tuple[int, int]]:
    """Replay a whole run recorded on CPU ranks (bench/alloc_history/sitecustomize.py, ULAB_ALLOC_CPU_TRACE: the
    engine's initialisation, then the steps) and return each step's (allocated, reserved) peaks, the peaks reset
    after the initialisation and after every step as the trainer's MemoryMeter resets them."""
    alloc = CachingAllocator()
    live: dict[int, Block] = {}
    steps: list[tuple[int, int]] = []
    for kind, key, nbytes, *stream in events:
        if kind == "alloc":
            live[key] = alloc.malloc(nbytes, *stream)
        elif kind == "free" and key in live:
            alloc.free(live.pop(key))
        elif kind == "empty_cache":
            alloc.empty_cache()
        elif kind in ("init_end", "step_end"):
            if kind == "step_end":
                steps.append((alloc.peak_allocated, alloc.peak_reserved))
            alloc.reset_peaks()
    return steps
