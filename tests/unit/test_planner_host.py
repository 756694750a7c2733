"""The host floor under a step (plan/host.py) and the memory-bound work (plan/membound.py), term by term."""
from __future__ import annotations

import pytest

from plan import host
from plan import throughput as thr
from plan.membound import memory_bound_s
from tests.unit.test_planner_terms import plan, spec_of

# a real-depth, narrow model: 32 layers whose device work is far below the host's
NARROW = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 32, "num_attention_heads": 4,
          "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 4096}


def test_a_short_step_takes_at_least_its_host_time_layer_by_layer_under_zero3():
    s = spec_of(plan({"config": NARROW}, seq=1024, grad_accum=2))
    t = thr.estimate_throughput(s)
    host_layer = 2.815e-3 + 2.407e-3 + 3.293e-3          # forward, backward, recompute (ZeRO-3, checkpointing)
    floor = 2 * (32 * host_layer + 5.75e-3)               # two micro batches
    assert t["step_time_s"] >= floor
    device_layer = (t["time_breakdown_s"]["compute"] / 2 - memory_bound_s(s)["loss"]) / 32
    assert device_layer < host_layer                       # the host is the longer one here
    assert t["time_breakdown_s"]["host_overhead"] > 0.5 * floor


def test_the_host_hides_behind_long_steps():
    s = spec_of(plan({"preset": "meta-llama/Llama-3.1-8B"}, sp=8, seq=262144))
    t = thr.estimate_throughput(s)
    # what is left is the per-micro-batch part and the optimizer's host loop beyond the GPU's update
    assert t["time_breakdown_s"]["host_overhead"] < 0.01 + host.optimizer_s(s)
    assert t["time_breakdown_s"]["host_overhead"] < 1e-3 * t["step_time_s"]


def test_zero3_hooks_cost_more_host_time_than_zero2():
    z3 = spec_of(plan({"config": NARROW}, seq=1024, zero_stage=3))
    z2 = spec_of(plan({"config": NARROW}, seq=1024, zero_stage=2))
    assert host.layer_s(z3) > host.layer_s(z2)
    assert (thr.estimate_throughput(z3)["time_breakdown_s"]["host_overhead"]
            > thr.estimate_throughput(z2)["time_breakdown_s"]["host_overhead"])


def test_tiled_mlp_pays_host_time_per_shard():
    base = spec_of(plan({"config": NARROW}, seq=4096))
    tiled = spec_of(plan({"config": NARROW}, seq=4096, tiled_mlp=True))
    assert host.tiled_shards(tiled) == 4096 // 256
    assert host.layer_s(tiled) - host.layer_s(base) == pytest.approx(16 * 2.25e-3)


def test_liger_kernels_move_fewer_bytes_than_the_eager_ones():
    eager = spec_of(plan({"preset": "meta-llama/Llama-3.1-8B"}, sp=8, seq=65536))
    liger = spec_of(plan({"preset": "meta-llama/Llama-3.1-8B"}, sp=8, seq=65536, liger_kernel=True))
    e, lg = memory_bound_s(eager), memory_bound_s(liger)
    assert lg["layer"] < 0.5 * e["layer"]
    assert lg["loss"] == pytest.approx(e["loss"] * 6 / 22)  # 3B per entry, never upcast, against 20 + B
    # an eager layer at 8192 tokens per rank, bf16: (2 norms x 36 B + 2 residual adds x 6 B) over hidden 4096,
    # RoPE 18 B over q + k (4096 + 1024), SwiGLU 10 B over 14336; forward, recompute, backward (2x)
    per_token = 2 * 36 * 4096 + 2 * 6 * 4096 + 18 * (4096 + 1024) + 10 * 14336
    assert e["layer"] == pytest.approx(8192 * 4 * per_token / (3.35e12 * 0.8))
