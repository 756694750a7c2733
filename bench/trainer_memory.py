"""The planner against what CPU ranks measure, per rank, for a grid of small plans; and the memory features at scale.

Grid (default): a tiny Llama (hidden 64, 2 layers, vocabulary 512, seq_len 256, packed multi-document data, fp32),
one real `ulab train` run per row (torchrun, gloo, 2 steps; the figure is step 2, when the optimizer states
exist). "measured" is the trainer's own per-rank peak on CPU (worker/trainer/metrics.py TensorMemoryTracker:
bytes of live tensor storages, states registered at the step's start); "planned" is plan.memory.estimate_memory
for the same plan, the unrounded sum of the peak phase (plan-v1 `peak_allocated_gib`) less the terms that exist
only on CUDA or that the CPU meter cannot see (`cpu_absent_bytes`: the cuBLAS workspaces, ZeRO-3's IPG bucket),
plus the states an offloading plan keeps in host memory (on CPU ranks that is the same memory, and the meter counts
them). tests/integration/test_trainer_memory.py holds
the session's shared trained runs (tests/integration/trainer_runs.py) to the same comparison and TOLERANCE.

Features in one process (`feature_drops`, also tested): TiledMLP, the tiled logits loss and the loss on bf16 logits
(`upcast_logits: false`), each at a size where its
phase is the peak, the model built and switched as the trainer does, under the trainer's CPU meter, against the
planner's activation peak with the feature off and on.

--scale: the older figures at a size where the features matter (SP scaling, tiled logits loss at a 32K vocabulary,
TiledMLP at intermediate 2048), seq_len 4096.

Usage: .venv/bin/python bench/trainer_memory.py [--keep DIR] [--rows name,name] [--scale [--seq-len 4096]]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ULAB = Path(sys.executable).parent / "ulab"
MIB = 2**20

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 2048}
# name -> (sp, dp, training overrides); every row: seq_len 256, micro batch 1, grad_accum 1, fp32, sdpa
GRID: dict[str, tuple[int, int, dict]] = {
    "sp1 z2": (1, 1, {"zero_stage": 2}),
    "sp2 z1": (2, 1, {"zero_stage": 1}),
    "sp2 z2": (2, 1, {"zero_stage": 2}),
    "sp2 z3": (2, 1, {"zero_stage": 3}),
    "sp2 z2 ckpt": (2, 1, {"zero_stage": 2, "activation_checkpointing": True}),
    "sp2 z2 ckpt+offload": (2, 1, {"zero_stage": 2, "activation_checkpointing": True, "checkpoint_offload": True}),
    "sp2 z3 ckpt+offload": (2, 1, {"zero_stage": 3, "activation_checkpointing": True, "checkpoint_offload": True}),
    "sp2 z2 tiled mlp": (2, 1, {"zero_stage": 2, "tiled_mlp": True}),
    "sp2 z2 tiled loss": (2, 1, {"zero_stage": 2, "tiled_logits_loss": True}),
    "sp2 z2 one document": (2, 1, {"zero_stage": 2}),  # the data: one long document per row instead of packed
    "sp2xdp2 z3": (2, 2, {"zero_stage": 3}),
    "sp2 z2 offload optimizer": (2, 1, {"zero_stage": 2, "offload_optimizer": True}),
    "sp2 z3 offload optimizer+params": (2, 1, {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}),
}
ONE_DOCUMENT = {"sp2 z2 one document"}
# measured / planned per-rank peak, both ways (see the README's table and test_trainer_memory.py for why)
TOLERANCE = (0.75, 1.5)


def cpu_absent_bytes(spec=None) -> int:
    """Planner terms the CPU meter cannot see: the cuBLAS workspaces, which exist only on CUDA
    (plan.memory.CUBLAS_WORKSPACE_BYTES), and, under ZeRO-3, the IPG gradient bucket, which DeepSpeed allocates when
    it builds the optimizer (stage3.py: `bucket.buffer = torch.empty(self.reduce_bucket_size, ...)` after
    initialize_optimizer_states), before any step, and never registers: the meter (worker/trainer/metrics.py
    TensorMemoryTracker) counts the registered states and what a step creates."""
    from plan.memory import CUBLAS_WORKSPACE_BYTES, grad_comm_bytes, zero_bucket_elements

    bucket = 0
    if spec is not None and spec.zero_stage == 3:
        bucket = grad_comm_bytes(spec) * zero_bucket_elements(spec.model.total_params)
    return CUBLAS_WORKSPACE_BYTES + bucket


def make_plan(data: Path, name: str, steps: int = 2, **run) -> dict:
    sp, dp, training = GRID[name]
    return {
        "model": {"config": dict(TINY)},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp * dp, "num_nodes": 1},
        "parallel": {"sp_size": sp, "dp_size": dp},
        "training": {"seq_len": 256, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "offload_optimizer": False, "offload_params": False, "activation_checkpointing": False,
                     "checkpoint_offload": False, "tiled_mlp": False, "tiled_logits_loss": False,
                     "attn_implementation": "sdpa", **training},
        "run": {"steps": steps, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None,
                "checkpoint_every": 0, **run},
    }


def planned(plan: dict) -> dict:
    """The planner's per-rank peak (bytes, CUDA-only terms removed), its phase and breakdown."""
    from plan.memory import cpu_terms, estimate_memory
    from plan.validation import validate

    v = validate({k: plan[k] for k in ("model", "hardware", "parallel", "training")})
    assert v.spec is not None, v.errors
    mem = estimate_memory(v.spec)
    # on CPU ranks the states a GPU run offloads to host memory are in the same memory as the rest: the planner's
    # host terms of one rank join its device peak (not its offloaded checkpoints: DeepSpeed keeps them in place
    # on CPU, and the device peak already counts the ones kept), at their own size: DeepSpeed's CPU accelerator
    # pins nothing, so torch's pinned-allocator rounding does not apply
    host_terms = cpu_terms(v.spec, 0.0, pinned=False)["breakdown"]
    host = sum(host_terms[k] for k in ("optimizer", "grads", "params")) / v.spec.ranks_per_node
    return {"bytes": mem["allocated"] - cpu_absent_bytes(v.spec) + host, "phase": mem["peak_phase"],
            "host_states": host, "breakdown": {k: float(x) for k, x in mem["breakdown"].items()}}


def measured(run_dir: Path, step: int = 2) -> dict:
    """The run's per-rank peaks (bytes) at `step`: allocated (states + activations) and activations."""
    from worker.trainer.attempt import read_metrics

    rec = next(m for m in read_metrics(run_dir) if m["step"] == step)
    gib = 2**30
    return {"allocated": [v * gib for v in rec["peak_allocated_gib"]],
            "activations": [v * gib for v in rec["peak_activations_gib"]], "measure": rec["memory_measure"]}


def write_data(root: Path) -> dict[str, Path]:
    """Packed short documents (the trainer tests' corpus) and one long document (one per row after packing)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.integration.trainer_support import write_documents

    packed = root / "docs.txt"
    if not packed.exists():
        write_documents(packed)
    one = root / "one_document.txt"
    if not one.exists():
        one.write_text(" ".join(f"token{i % 997}" for i in range(4096)) + "\n")
    return {"packed": packed, "one": one}


def train_row(root: Path, name: str) -> Path:
    data = write_data(root)
    run_dir = root / name.replace(" ", "_").replace("+", "_")
    if (run_dir / "metrics.jsonl").exists():
        return run_dir
    plan_file = root / f"{run_dir.name}.json"
    plan_file.write_text(json.dumps(make_plan(data["one" if name in ONE_DOCUMENT else "packed"], name)))
    proc = subprocess.run([str(ULAB), "train", "--plan", str(plan_file), "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip().splitlines()[-1]}")
    return run_dir


def table(root: Path, names: list[str]) -> list[dict]:
    rows = []
    for name in names:
        run_dir = train_row(root, name)
        p, m = planned(make_plan(Path("unused"), name)), measured(run_dir)
        peak = max(m["allocated"])
        rows.append({"row": name, "planned_mib": p["bytes"] / MIB, "measured_mib": peak / MIB,
                     "ratio": peak / p["bytes"], "phase": p["phase"],
                     "measured_activations_mib": max(m["activations"]) / MIB})
    return rows


def print_table(rows: list[dict]) -> None:
    print("| plan (tiny Llama, seq 256, fp32) | planned MiB/rank | measured MiB/rank (max) | measured/planned | "
          "planner peak phase | measured activations MiB |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for r in rows:
        print(f"| {r['row']} | {r['planned_mib']:.2f} | {r['measured_mib']:.2f} | {r['ratio']:.2f} | {r['phase']} | "
              f"{r['measured_activations_mib']:.2f} |")


# ---- --scale: the features where they matter ----
def scale_plan(data: Path, *, sp: int, seq_len: int, vocab: int = 512, hidden: int = 64, inter: int = 256,
               tiled_logits: bool = False, tiled_mlp: bool = False) -> dict:
    return {
        "model": {"config": {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": inter,
                             "vocab_size": vocab, "max_position_embeddings": max(2048, seq_len)}},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp, "num_nodes": 1},
        "parallel": {"sp_size": sp, "dp_size": 1},
        "training": {"seq_len": seq_len, "micro_batch_size": 1, "grad_accum": 1, "dtype": "fp32", "zero_stage": 2,
                     "tiled_logits_loss": tiled_logits, "tiled_mlp": tiled_mlp, "attn_implementation": "sdpa"},
        "run": {"steps": 2, "learning_rate": 1e-3, "seed": 0, "data": {"path": str(data)}, "model_path": None},
    }


def run(tmp: Path, name: str, p: dict) -> dict:
    pf = tmp / f"{name}.json"
    pf.write_text(json.dumps(p))
    rd = tmp / name
    proc = subprocess.run([str(ULAB), "train", "--plan", str(pf), "--run-dir", str(rd)], capture_output=True,
                          text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {proc.stderr.strip().splitlines()[-1]}")
    return [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()][-1]


def scale(seq_len: int, vocab: int) -> None:
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        data = tmp / "one_document.txt"  # one long document: plain causal attention, no packing mask
        data.write_text(" ".join(f"token{i % 997}" for i in range(seq_len * 2)))
        L = seq_len
        one = run(tmp, "sp1", scale_plan(data, sp=1, seq_len=L))
        two = run(tmp, "sp2", scale_plan(data, sp=2, seq_len=L))
        a1, a2 = one["peak_activations_gib"][0], max(two["peak_activations_gib"])
        print(f"SP scaling at seq_len {L} (hidden 64, 2 layers, 4 heads), measure: {one['memory_measure']}")
        print(f"  one process : peak activations {a1 * 1024:8.2f} MiB, "
              f"peak allocated {one['peak_allocated_gib'][0] * 1024:8.2f} MiB")
        print(f"  SP=2 per rank: peak activations {a2 * 1024:8.2f} MiB, "
              f"peak allocated {max(two['peak_allocated_gib']) * 1024:8.2f} MiB")
        print(f"  ratio SP=2 / one process (activations): {a2 / a1:.3f}   (target <= 0.6)")
        plain = run(tmp, "logits_plain", scale_plan(data, sp=1, seq_len=L // 2, vocab=vocab))
        tiled = run(tmp, "logits_tiled", scale_plan(data, sp=1, seq_len=L // 2, vocab=vocab, tiled_logits=True))
        p, q = plain["peak_allocated_gib"][0], tiled["peak_allocated_gib"][0]
        print(f"Tiled logits loss at seq_len {L // 2}, vocab {vocab}:")
        print(f"  plain loss: peak allocated {p * 1024:8.2f} MiB "
              f"(activations {plain['peak_activations_gib'][0] * 1024:.2f})")
        print(f"  tiled loss: peak allocated {q * 1024:8.2f} MiB "
              f"(activations {tiled['peak_activations_gib'][0] * 1024:.2f})")
        print(f"  ratio tiled / plain: {q / p:.3f};  loss plain {plain['loss']:.6f} vs tiled {tiled['loss']:.6f}")
        big = dict(hidden=64, inter=2048)
        mlp = run(tmp, "mlp_plain", scale_plan(data, sp=1, seq_len=L, **big))
        tmlp = run(tmp, "mlp_tiled", scale_plan(data, sp=1, seq_len=L, tiled_mlp=True, **big))
        m, n = mlp["peak_activations_gib"][0], tmlp["peak_activations_gib"][0]
        print(f"TiledMLP at seq_len {L}, intermediate 2048:")
        print(f"  plain MLP: peak activations {m * 1024:8.2f} MiB;  TiledMLP: {n * 1024:8.2f} MiB;  ratio {n / m:.3f}")
        print(f"  loss plain {mlp['loss']:.6f} vs tiled {tmlp['loss']:.6f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", type=Path, default=None, help="keep (and reuse) the grid's run directories here")
    ap.add_argument("--rows", default=None, help="comma-separated grid rows (default: all)")
    ap.add_argument("--scale", action="store_true", help="the features at seq_len --seq-len instead of the grid")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=32768)
    a = ap.parse_args()
    if a.scale:
        scale(a.seq_len, a.vocab)
        return
    names = a.rows.split(",") if a.rows else list(GRID)
    if a.keep:
        a.keep.mkdir(parents=True, exist_ok=True)
        print_table(table(a.keep, names))
    else:
        with tempfile.TemporaryDirectory() as t:
            print_table(table(Path(t), names))


if __name__ == "__main__":
    main()


# ---- one process, no engine: a feature's own activation drop against the planner's ----
FEATURE_PLANS = {  # each where the feature's phase is the peak, so the planner predicts a drop at all
    "tiled_mlp": {"hidden_size": 64, "intermediate_size": 2048, "vocab_size": 512, "seq_len": 1024},
    # shards of 64 tokens (2 MiB of fp32 logits) instead of 1 GiB: 16 shards at this size
    "tiled_logits_loss": {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 8192, "seq_len": 1024,
                          "shard_bytes": 2 * MIB},
    # the loss on bf16 logits (ms-swift's sequence-parallel loss): saves when the field is false; a bf16 model
    "upcast_logits": {"hidden_size": 64, "intermediate_size": 128, "vocab_size": 8192, "seq_len": 1024,
                      "dtype": "bf16", "saves_when": False},
}


def feature_plan(feature: str, on: bool) -> dict:
    """The feature's plan with its saving switched on (`on`) or off; `saves_when` is the field's saving value."""
    f = FEATURE_PLANS[feature]
    value = on if f.get("saves_when", True) else not on
    cfg = {**TINY, "hidden_size": f["hidden_size"], "intermediate_size": f["intermediate_size"],
           "vocab_size": f["vocab_size"], "max_position_embeddings": f["seq_len"]}
    return {"model": {"config": cfg}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1, "num_nodes": 1},
            "parallel": {"sp_size": 1, "dp_size": 1},
            "training": {"seq_len": f["seq_len"], "micro_batch_size": 1, "grad_accum": 1,
                         "dtype": f.get("dtype", "fp32"), "zero_stage": 0, "activation_checkpointing": False,
                         "tiled_mlp": False, "tiled_logits_loss": False, "attn_implementation": "sdpa",
                         feature: value},
            "run": {"steps": 1, "learning_rate": 1e-3, "seed": 0, "data": {"path": "unused"}, "model_path": None}}


def planned_activations(plan: dict) -> float:
    """The planner's activation bytes at its peak activation phase (activations + logits/loss + comm buffers)."""
    from plan.memory import estimate_memory
    from plan.validation import validate

    v = validate({k: plan[k] for k in ("model", "hardware", "parallel", "training")})
    assert v.spec is not None, v.errors
    return max(sum(p.values()) for p in estimate_memory(v.spec)["activation_phases"].values())


def measured_activations(plan: dict) -> float:
    """One forward and backward of the plan's model in this process, built and switched as the trainer does
    (worker/trainer/modeling.py), under the trainer's own CPU meter: the peak bytes of the tensors created."""
    import torch

    from worker.trainer.metrics import TensorMemoryTracker
    from worker.trainer.modeling import build_model, enable_tiled_mlp, token_loss_sum
    from worker.trainer.spec import RunSpec

    spec = RunSpec.from_plan(plan)
    model = build_model(spec, "sdpa")
    if spec.tiled_mlp:
        enable_tiled_mlp(model)
    model.train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, spec.plan.training.seq_len), generator=g)
    pos = torch.arange(ids.shape[1]).unsqueeze(0)
    labels = torch.nn.functional.pad(ids[..., 1:], (0, 1), value=-100)
    tracker = TensorMemoryTracker()
    tracker.register(model.parameters())
    with tracker:
        if spec.tiled_logits_loss:  # as UlyssesTrainer.compute_loss drives the TiledLossHead
            head = model.get_output_embeddings()
            head.labels, head.scale = labels, 1.0 / int((labels != -100).sum())
            loss = model(input_ids=ids, position_ids=pos, use_cache=False).logits.reshape(())
            head.labels = None
        else:
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits
            loss = token_loss_sum(logits, labels, spec.upcast_logits) / int((labels != -100).sum())
            del logits
        loss.backward()
        del loss
    return float(tracker.peak_created)


@contextlib.contextmanager
def loss_shard_bytes(n: int | None):
    """The tiled loss's shard size (plan.memory.TILED_LOSS_SHARD_BYTES, 1 GiB of fp32 logits), which the planner
    and the trainer both read at call time, set smaller so a small sequence has several shards."""
    from plan import memory

    old = memory.TILED_LOSS_SHARD_BYTES
    memory.TILED_LOSS_SHARD_BYTES = n or old
    try:
        yield
    finally:
        memory.TILED_LOSS_SHARD_BYTES = old


def feature_drops(features=None) -> dict:
    """feature -> the planner's and the trainer's activation peak with the feature off and on (bytes)."""
    out = {}
    for feature in features or FEATURE_PLANS:
        off, on = feature_plan(feature, False), feature_plan(feature, True)
        with loss_shard_bytes(FEATURE_PLANS[feature].get("shard_bytes")):
            p0, p1 = planned_activations(off), planned_activations(on)
            m0, m1 = measured_activations(off), measured_activations(on)
        out[feature] = {"planned_off": p0, "planned_on": p1, "measured_off": m0, "measured_on": m1}
    return out
