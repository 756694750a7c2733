"""Replay of PyTorch's CUDA caching allocator over a step's recorded allocations: the reserved peak it predicts
against the H100 rows' measured `max_memory_reserved` (expandable segments off) and the planner's allocator model.

    .venv/bin/python bench/allocator_replay.py [--steps 3] [--rows suite-zero2,...]
    .venv/bin/python bench/allocator_replay.py --snapshot RUN/123.pickle   # a GPU run's own trace, replayed
    .venv/bin/python bench/allocator_replay.py --record-cpu --rows suite-zero2 --steps 2   # a whole CPU run

`--record-cpu` runs the row's plan with the trainer itself (`ulab train`, one CPU rank) under
bench/alloc_history/sitecustomize.py, which records every allocation from `deepspeed.initialize` on (the engine's
flat buffers, the fp32 partition, the optimizer states created at the first step, DeepSpeed's gradient hooks),
and replays the whole run, the peaks reset at each step as the trainer's MemoryMeter resets them.

`--snapshot` reads the trace torch's allocator records of a real GPU run (bench/alloc_history/sitecustomize.py:
the model's build, DeepSpeed's initialisation and the steps, every stream) and replays it: the rules checked on
the real sequence, the recorded reserved peak beside the replayed one.

The allocation sequence: each H100 row's plan (the CSV's `plan` column) is traced by plan.traced.trace_peak_bytes
(the real Hugging Face model under FakeTensorMode, one micro batch forward + backward, on CPU) with a recorder
(`Recorder`, a MemTracker subclass): MemTracker already holds every storage through a weakref whose finalizer
fires when the storage dies; the recorder appends ("alloc", id, bytes) when MemTracker adds a storage and
("free", id) when its finalizer fires, in order, keeping no reference to any tensor. Parameters and buffers are
left out of the replay: they are allocated once before the step, in their own segments (so is ZeRO's optimizer
state). Parameter gradients are in the sequence, freed once accumulated (the trace drops each one as ZeRO's
reduce-scatter does). For ZeRO-1/2 the optimizer step's fp32 gradient partition (plan.memory's `step_fp32_grads`,
DeepSpeed stage_1_and_2.py flattens the partition's gradients to fp32 before the step) is allocated after the
backward and freed after the step. The step is replayed `--steps` times into one allocator (its cache carries over
from step to step, as in the run).

Reading the table: the replay gives the step's transient allocated peak A and reserved peak R. The row's measured
allocated peak less A is what the step did not trace (model states, ZeRO buffers): it is counted as allocated in
its own exactly-sized segments, so the replayed reserved is measured allocated + (R - A), and the replayed ratio is
that over the measured allocated. The planner's ratio is plan.memory.estimate_memory's reserved / allocated for the
same plan, today's planner.

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

import argparse
import bisect
import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2 ** 30
MIB = 2 ** 20
# torch/include/c10/core/AllocatorConfig.h (torch 2.13); K_LARGE_BUFFER from CUDACachingAllocator.cpp (docstring)
K_MIN_BLOCK_SIZE = 512
K_SMALL_SIZE = 1 * MIB
K_SMALL_BUFFER = 2 * MIB
K_MIN_LARGE_ALLOC = 10 * MIB
K_LARGE_BUFFER = 20 * MIB
K_ROUND_LARGE = 2 * MIB

H100_CSV = ROOT / "bench" / "results" / "gpu-nvidia-h100-80gb-hbm3-2026-11-27.csv"
# Rows measured without expandable segments, first the ones the brief names; the ALST rows (parameter and
# checkpoint offload, tiled loss) after them.
DEFAULT_ROWS = ("suite-zero2", "suite-zero3", "suite-liger", "sweep-llama-1b-plain-16384",
                "sweep-llama-1b-tiled-16384", "suite-alst", "suite-liger-alst", "sweep-llama-1b-alst-16384")


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


def recorder():
    """A MemTracker that also logs, in order, each tracked storage's allocation and its finalization."""
    from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType, _UpdateType

    class Recorder(MemTracker):
        def __init__(self) -> None:
            super().__init__()
            self.events: list[Event] = []
            self._ids: dict[int, int] = {}  # id(winfo) -> event id, while the storage lives

        def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None) -> None:
            super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
            if u_type == _UpdateType.ADD and winfo.reftype not in (_MemRefType.PARAM, _MemRefType.BUFFER):
                self._ids[id(winfo)] = len(self.events)
                self.events.append(("alloc", len(self.events), winfo.mem_consumed))
            elif u_type == _UpdateType.DEL and id(winfo) in self._ids:
                self.events.append(("free", self._ids.pop(id(winfo)), 0))
            elif u_type == _UpdateType.SIZE and id(winfo) in self._ids:  # resize_: a new allocation
                self.events.append(("free", self._ids.pop(id(winfo)), 0))
                self._ids[id(winfo)] = len(self.events)
                self.events.append(("alloc", len(self.events), winfo.mem_consumed))

    return Recorder()


def trainer_loss_head(spec):
    """The trainer's tiled logits loss (worker/trainer/modeling.py TiledLossHead: DeepSpeed's TiledFusedLogitsLoss
    for ZeRO 0-2, sequence_tiled_compute for ZeRO-3), installed on the traced model. The head it calls per shard is
    the lm_head's weight applied functionally: MemTracker's module hooks cannot follow the no-grad shard forwards
    (as plan/traced.py runs TiledMLP's shards)."""
    def install(model, labels) -> None:
        import torch.nn.functional as F

        from worker.trainer.modeling import TiledLossHead

        lm_head = model.get_output_embeddings()

        class Head:
            weight, out_features = lm_head.weight, lm_head.out_features

            def __call__(self, x):
                return F.linear(x, self.weight)

        wrapper = TiledLossHead(Head(), spec.zero_stage, spec.upcast_logits)  # type: ignore[arg-type]
        wrapper.labels = labels
        model.set_output_embeddings(wrapper)
    return install


def step_events(plan: dict) -> tuple[list[Event], object]:
    """The recorded allocation sequence of one step of `plan`, and its spec."""
    from plan.memory import state_terms
    from plan.traced import config_for_plan, trace_peak_bytes
    from plan.validation import validate

    spec = validate(plan).spec
    assert spec is not None, plan
    rec = recorder()
    trace_peak_bytes(spec, config_for_plan(spec), tracker=rec,
                     loss_head=trainer_loss_head(spec) if spec.tiled_logits_loss else None)
    events = list(rec.events)
    step = int(state_terms(spec)["step_fp32_grads"])
    if step:  # ZeRO-1/2: the fp32 gradient partition of the optimizer step
        events += [("alloc", len(events), step), ("free", len(events), 0)]
    return events, spec


def snapshot_events(snapshot: dict, device: int = 0) -> tuple[list[Event], int]:
    """The allocation sequence in a snapshot of torch.cuda.memory._dump_snapshot (its `device_traces`, recorded by
    bench/alloc_history/sitecustomize.py), and the peak of the bytes the real allocator held from cudaMalloc
    (its segment_alloc less its segment_free entries). An "alloc" entry's size is the block it handed out
    (rounded, or a whole unsplit block); a block is free again at its "free_completed" (after another stream's use
    of it ends); a run of "segment_free" entries (empty_cache(), or a failed cudaMalloc's release) releases every
    wholly free segment. Each allocation keeps its stream (ZeRO-3's gathers run on their own)."""
    events: list[Event] = []
    live: dict[int, int] = {}  # address -> event id
    reserved = peak = 0
    for e in snapshot["device_traces"][device]:
        action = e["action"]
        if action == "alloc":
            live[e["addr"]] = len(events)
            events.append(("alloc", len(events), e["size"], e["stream"]))
        elif action == "free_completed" and e["addr"] in live:
            events.append(("free", live.pop(e["addr"]), 0))
        elif action == "segment_alloc":
            reserved += e["size"]
            peak = max(peak, reserved)
        elif action == "segment_free":
            reserved -= e["size"]
            if not events or events[-1][0] != "empty_cache":
                events.append(("empty_cache", 0, 0))
    return events, peak


def compare_snapshot(path: str) -> None:
    """Replay a recorded GPU trace (whole run: build, initialisation, steps) and set the replay's segments against
    the ones the real allocator created: the rules checked on the real sequence, not on a CPU trace."""
    import pickle

    with open(path, "rb") as f:
        snap = pickle.load(f)
    events, recorded_peak = snapshot_events(snap)
    alloc = replay(events)
    print(f"{path}: {sum(1 for e in events if e[0] == 'alloc')} allocations; reserved peak recorded "
          f"{recorded_peak / GIB:.2f} GiB, replayed {alloc.peak_reserved / GIB:.2f} GiB (allocated peak "
          f"{alloc.peak_allocated / GIB:.2f} GiB)")


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


def compare_cpu_trace(path: str, row_name: str) -> None:
    """A CPU run's recorded sequence replayed, step by step, against an H100 row's measured peaks."""
    with open(path) as f:
        events = [tuple(e) for e in json.load(f)]
    row = h100_rows((row_name,))[0]
    print(f"{path}: {sum(1 for e in events if e[0] == 'alloc')} allocations, against {row_name} (measured "
          f"allocated {float(row['measured_allocated_gib']):.2f}, reserved {float(row['measured_reserved_gib']):.2f}"
          f" GiB, ratio {float(row['measured_reserved_gib']) / float(row['measured_allocated_gib']):.3f})")
    for i, (a, r) in enumerate(replay_steps(events), 1):
        print(f"  step {i}: replayed allocated {a / GIB:.2f}, reserved {r / GIB:.2f} GiB, ratio {r / a:.3f}")


def record_cpu_run(row_name: str, out: Path, steps: int) -> Path:
    """Run the row's plan with `ulab train` on one CPU rank (`steps` steps on the trainer tests' corpus,
    bench/trainer_memory.py's data) under bench/alloc_history/sitecustomize.py; return the recorded sequence."""
    import os
    import subprocess

    from bench.trainer_memory import write_data

    plan = json.loads(h100_rows((row_name,))[0]["plan"])
    plan["run"] = {"steps": steps, "learning_rate": 1e-3, "seed": 0, "model_path": None, "checkpoint_every": 0,
                   "data": {"path": str(write_data(out)["packed"])}}
    (out / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "bench" / "alloc_history"),
           "ULAB_ALLOC_CPU_TRACE": str(out / "trace")}
    subprocess.run([str(Path(sys.executable).parent / "ulab"), "train", "--plan", str(out / "plan.json"),
                    "--run-dir", str(out / "run")], env=env, check=True, capture_output=True, timeout=3600)
    return next((out / "trace").glob("*.json"))


def h100_rows(names: tuple[str, ...]) -> list[dict]:
    with open(H100_CSV) as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    return [rows[n] for n in names if n in rows and float(rows[n]["measured_allocated_gib"] or 0) > 0]


def compare(row: dict, steps: int) -> dict:
    from plan.memory import estimate_memory

    plan = json.loads(row["plan"])
    events, spec = step_events(plan)
    alloc = replay(events, steps)
    first = replay(events, 1)
    measured_a = float(row["measured_allocated_gib"]) * GIB
    measured_r = float(row["measured_reserved_gib"]) * GIB
    mem = estimate_memory(spec)
    gap = alloc.peak_reserved - alloc.peak_allocated
    return {"row": row["name"], "allocated": measured_a / GIB, "reserved": measured_r / GIB,
            "measured_ratio": measured_r / measured_a, "replay_a": alloc.peak_allocated / GIB,
            "replay_gap": gap / GIB, "replay_gap_1": (first.peak_reserved - first.peak_allocated) / GIB,
            "replayed_ratio": (measured_a + gap) / measured_a, "planner_ratio": mem["reserved"] / mem["allocated"],
            "planner_gap": mem["stranded"] / GIB, "segments": len(alloc.segments)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="steps replayed into one allocator")
    ap.add_argument("--rows", default=",".join(DEFAULT_ROWS), help="H100 rows (the CSV's `name`)")
    ap.add_argument("--snapshot", action="append", default=[],
                    help="replay a GPU run's recorded trace instead (bench/alloc_history/sitecustomize.py)")
    ap.add_argument("--cpu-trace", default=None, help="replay a CPU run's recorded sequence (ULAB_ALLOC_CPU_TRACE, "
                    "bench/alloc_history/sitecustomize.py) against the row `--rows` names")
    ap.add_argument("--record-cpu", action="store_true", help="record the first `--rows` row's run on a CPU rank "
                    "(`ulab train`, `--steps` steps, minutes per step at the H100 rows' sizes) and replay it")
    args = ap.parse_args()
    if args.record_cpu:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            compare_cpu_trace(str(record_cpu_run(args.rows.split(",")[0], Path(tmp), args.steps)),
                              args.rows.split(",")[0])
        return
    if args.cpu_trace:
        compare_cpu_trace(args.cpu_trace, args.rows.split(",")[0])
        return
    if args.snapshot:
        for path in args.snapshot:
            compare_snapshot(path)
        return
    print(f"caching allocator replay, {args.steps} steps, against {H100_CSV.name} (expandable segments off)")
    print("GiB; gap = reserved - allocated; replay A = the step's traced transient allocated peak")
    print(f"{'row':34} {'alloc':>7} {'reserved':>8} {'meas gap':>8} {'meas ratio':>10} {'replay A':>8} "
          f"{'gap 1 step':>10} {'replay gap':>10} {'replay ratio':>12} {'planner gap':>11} {'planner ratio':>13}")
    for row in h100_rows(tuple(args.rows.split(","))):
        r = compare(row, args.steps)
        print(f"{r['row']:34} {r['allocated']:7.2f} {r['reserved']:8.2f} {r['reserved'] - r['allocated']:8.2f} "
              f"{r['measured_ratio']:10.3f} {r['replay_a']:8.2f} {r['replay_gap_1']:10.2f} {r['replay_gap']:10.2f} "
              f"{r['replayed_ratio']:12.3f} {r['planner_gap']:11.2f} {r['planner_ratio']:13.3f}", flush=True)


if __name__ == "__main__":
    main()
