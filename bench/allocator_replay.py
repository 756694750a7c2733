"""Replay of PyTorch's CUDA caching allocator over a step's recorded allocations: the reserved peak it predicts
against the H100 rows' measured `max_memory_reserved` (expandable segments off) and the planner's allocator model.

    .venv/bin/python bench/allocator_replay.py [--steps 3] [--rows suite-zero2,...]
    .venv/bin/python bench/allocator_replay.py --snapshot RUN/123.pickle   # a GPU run's own trace, replayed
    .venv/bin/python bench/allocator_replay.py --record-cpu --rows suite-zero2 --steps 2   # a whole CPU run
    .venv/bin/python bench/allocator_replay.py --corpus A1-max,A2-max,A3-max,A4-max [--layers 8]

`--corpus` replays the step of published max-length rows (bench/data/published_corpus.csv) at their published
length, the model cut to `--layers` decoder layers (the step's transients repeat per layer; the checkpoints of the
left-out layers are allocated once, before the backward, in segments of their own) and expandable segments off,
beside the planner's own stranded bytes and what the card had left at that length by the planner (80 GiB less its
device total, where the published row says the card was full): how much of that the allocator's rules, over the
step's own sequence, add to the planner (`replay beyond`).

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

"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.caching_allocator import GIB, Event, replay, replay_steps  # noqa: E402

H100_CSV = ROOT / "bench" / "results" / "gpu-nvidia-h100-80gb-hbm3-2026-11-27.csv"
# Rows measured without expandable segments, first the ones the brief names; the ALST rows (parameter and
# checkpoint offload, tiled loss) after them.
DEFAULT_ROWS = ("suite-zero2", "suite-zero3", "suite-liger", "sweep-llama-1b-plain-16384",
                "sweep-llama-1b-tiled-16384", "suite-alst", "suite-liger-alst", "sweep-llama-1b-alst-16384")


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


def corpus_rows(ids: list[str], layers: int) -> None:
    """The published max-length rows' steps replayed at their published length (module docstring: `--corpus`)."""
    import copy

    from bench.corpus import read_corpus
    from plan import estimate
    from plan.validation import validate

    rows = {r["id"]: r for r in read_corpus()}
    print(f"caching allocator replay of one step at the published length, {layers} decoder layers, expandable "
          "segments off (GiB)")
    print(f"{'row':10} {'tokens/rank':>11} {'replay A':>9} {'replay R':>9} {'replay gap':>10} {'planner stranded':>16} "
          f"{'replay beyond':>13} {'left of the card':>16} {'beyond / left':>13}")
    for rid in ids:
        row = rows[rid]
        plan = copy.deepcopy(row["plan"])
        plan["training"]["seq_len"] = int(float(row["published"]))
        plan["training"]["expandable_segments"] = False
        mem = estimate(plan)["memory"]
        left = mem["gpu_capacity_gib"] - mem["device_total_gib"]
        spec = validate(plan).spec
        assert spec is not None
        m = spec.model
        cut = copy.deepcopy(plan)
        cut["model"] = {"config": {"model_type": "llama", "hidden_size": m.hidden_size, "num_hidden_layers": layers,
                                   "num_attention_heads": m.num_attention_heads,
                                   "num_key_value_heads": m.num_key_value_heads,
                                   "intermediate_size": m.intermediate_size, "vocab_size": m.vocab_size,
                                   "max_position_embeddings": max(plan["training"]["seq_len"], 131072),
                                   "rope_theta": 500000.0}}
        events, _ = step_events(cut)
        alloc = replay(events)
        gap = (alloc.peak_reserved - alloc.peak_allocated) / GIB
        beyond = gap - mem["allocator_stranded_gib"]  # what the replay adds to the planner's device total
        print(f"{rid:10} {spec.local_tokens:>11,} {alloc.peak_allocated / GIB:9.2f} {alloc.peak_reserved / GIB:9.2f} "
              f"{gap:10.2f} {mem['allocator_stranded_gib']:16.2f} {beyond:13.2f} {left:16.2f} {beyond / left:13.0%}",
              flush=True)


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
    ap.add_argument("--corpus", default=None, help="published max-length rows (ids, comma-separated) replayed at "
                    "their published length")
    ap.add_argument("--layers", type=int, default=8, help="with --corpus: decoder layers the model is cut to")
    args = ap.parse_args()
    if args.corpus:
        corpus_rows(args.corpus.split(","), args.layers)
        return
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
