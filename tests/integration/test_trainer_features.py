"""ALST memory features, a two-stage run, SP=2 across two nodes at a c10d rendezvous, and a real out-of-memory,
with real `ulab train` runs; each compared where it can be with the plain SP=2 run (trainer_runs.py)."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys

import pytest

from plan.launch import torchrun_command
from tests.integration.trainer_support import make_plan, metrics, train
from worker.trainer.attempt import read_evals
from worker.trainer.net import free_port

pytestmark = pytest.mark.slow


def test_alst_features_under_zero3_with_offload_match_the_plain_run(runs):
    """TiledMLP, tiled logits loss, activation checkpointing with CPU offload, ZeRO-3 with optimizer and parameter
    offload, all on: the same per-step loss as the plain SP=2 run (tiling and offload change memory, not math)."""
    run_dir = runs.alst()
    got = metrics(run_dir)
    base = metrics(runs.sp2())
    # the offloaded optimizer is DeepSpeed's CPU Adam, and each of the node's 2 ranks has its share of the cores
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    assert f"optimizer: DeepSpeedCPUAdam; {threads} CPU threads per rank" in (run_dir / "console.txt").read_text()
    assert [m["step"] for m in got] == [1, 2, 3, 4, 5]
    for a, b in zip(base, got):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * a["loss"], (a["step"], a["loss"], b["loss"])
        # the same gradient norm too (so clipping acts alike): ZeRO-3 under SP needs the trainer's correction
        assert abs(a["grad_norm"] - b["grad_norm"]) <= 1e-3 * a["grad_norm"], \
            (a["step"], a["grad_norm"], b["grad_norm"])


def test_two_stage_run_starts_stage_two_from_stage_one(runs):
    """Also the long-context evaluations: a passkey test of stage 1's model, and the loss by position of each
    stage's held-back row at its end (the run page draws both)."""
    run_dir = runs.stages()
    m = metrics(run_dir)
    assert [x["step"] for x in m] == list(range(1, 8))
    evals = read_evals(run_dir)
    assert [(e["eval"], e["step"], e["stage"]) for e in evals] == [
        ("position_loss", 4, 0), ("passkey", 4, 0), ("position_loss", 7, 1)], evals
    for e in (evals[0], evals[2]):  # log2 buckets of the position in the document (the documents are short)
        edges = [int(k.split("@")[1]) for k in e if k.startswith("pos_loss@")]
        assert edges == [2 ** k for k in range(len(edges))], e
        assert e["eval_loss"] > 0, e
    cells = {k: v for k, v in evals[1].items() if k.startswith("passkey@")}
    assert sorted(cells) == sorted(f"passkey@{n}@{d}" for n in (128, 512) for d in (0, 50, 100))
    assert all(0 <= v <= 1 for v in cells.values())  # a tiny random model scores about nothing: the machinery runs
    assert [x["seq_len"] for x in m] == [256] * 4 + [512] * 3
    assert (run_dir / "stages" / "stage0" / "model.safetensors").exists()
    # a fresh model starts near ln(vocab) = 6.24; stage 2 must start from stage 1's weights, well below it
    assert m[4]["loss"] < m[0]["loss"] - 0.2, [x["loss"] for x in m]
    assert all(math.isfinite(x["loss"]) for x in m)


def test_two_nodes_meet_at_c10d_rendezvous_with_sp_across_them(runs):
    plan = make_plan(runs.root / "nodes.json", runs.data, sp=2, dp=1, gas=2, steps=4, nodes=2)
    run_dir = runs.root / "nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    for node in (0, 1):
        cmd = torchrun_command(plan, run_dir, nproc_per_node=1, nnodes=2, node_rank=node,
                               rdzv_endpoint=endpoint, rdzv_id="ulab-test", python=sys.executable)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], errs[0][-1500:] + errs[1][-1500:]
    m = metrics(run_dir)
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    assert all(len(x["peak_allocated_gib"]) == 2 for x in m)
    # SP=2 over two nodes computes what SP=2 on one node computes
    ref = metrics(runs.sp2())
    for a, b in zip(ref[:4], m):
        assert abs(a["loss"] - b["loss"]) <= 1e-4, (a["step"], a["loss"], b["loss"])


def test_out_of_memory_names_the_rank_and_size(runs):
    """A real allocation failure (a 2^24-token vocabulary of width 2^13: 512 GiB of fp32 embeddings, the first
    tensor the model allocates) on 2 ranks under torchrun."""
    plan = make_plan(runs.root / "oom.json", runs.data, sp=2, steps=1)
    spec = json.loads(plan.read_text())
    spec["model"]["config"].update(vocab_size=2**24, hidden_size=2**13)
    plan.write_text(json.dumps(spec))
    proc = train(plan, runs.root / "oom")
    assert proc.returncode == 3, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "out of memory on rank" in last, last
    assert "512.00 GiB" in last, last
    record = json.loads((runs.root / "oom" / "outcome.json").read_text())  # the launcher's, from the first rank's
    assert (record["cause"], record["exit_code"]) == ("oom", 3)
    assert record["rank"] in (0, 1)
    assert "tried to allocate 512.00 GiB" in record["message"]
