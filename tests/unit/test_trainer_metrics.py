"""Metrics pieces: the CPU tensor-memory tracker, the FLOPs formula, the JSONL writer and resume truncation."""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from transformers import Qwen3Config

from backend.planner.catalog import models
from backend.planner.throughput import flops_per_token as planner_flops_per_token
from backend.planner.validate import parse
from tests.plans import qwen_plan
from worker.trainer.metrics import MetricsWriter, TensorMemoryTracker, flops_per_token, truncate_after

MIB = 1024**2


def test_tracker_counts_live_storages_and_their_peak():
    with TensorMemoryTracker() as t:
        a = torch.ones(4 * MIB, dtype=torch.uint8)  # 4 MiB
        b = torch.ones(2 * MIB, dtype=torch.uint8)
        view = a[: MIB]  # a view: same storage, counted once
        assert t.current == 6 * MIB
        del a, view
        assert t.current == 2 * MIB  # freed storages leave the count
        c = torch.ones(MIB, dtype=torch.uint8)
    assert t.peak == 6 * MIB and t.peak_created == 6 * MIB
    del b, c


def test_tracker_registers_existing_state_without_counting_it_as_created():
    w = torch.zeros(MIB, dtype=torch.uint8)
    with TensorMemoryTracker() as t:
        t.register([w, w])
        x = torch.ones(MIB, dtype=torch.uint8)
    assert t.peak == 2 * MIB and t.peak_created == MIB
    del x


def test_flops_per_token_follows_palm_formula_causal():
    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=512)
    # per layer: q,o 2*64*64 + k,v 2*64*32 + mlp 3*64*128; plus lm_head 64*512; attention halved for the mask
    n = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 512
    assert flops_per_token(cfg, 256) == 6 * n + 6 * 2 * 4 * 16 * 256


def test_trainer_counts_the_planners_model_flops():
    # what the run page shows beside the planner's prediction must be counted the same way
    qwen = models()["Qwen/Qwen3-4B"]
    cfg = Qwen3Config(hidden_size=qwen.hidden_size, num_hidden_layers=qwen.num_hidden_layers,
                      num_attention_heads=qwen.num_attention_heads, num_key_value_heads=qwen.num_key_value_heads,
                      head_dim=qwen.head_dim, intermediate_size=qwen.intermediate_size, vocab_size=qwen.vocab_size,
                      tie_word_embeddings=True)
    spec = parse(qwen_plan(seq_len=32768))[0]
    assert flops_per_token(cfg, 32768) == planner_flops_per_token(spec)["model"]


def test_writer_keeps_lines_valid_json_and_truncate_drops_later_steps(tmp_path):
    p = tmp_path / "metrics.jsonl"
    w = MetricsWriter(p)
    for s in range(1, 6):
        w.write({"step": s, "loss": float("nan") if s == 3 else 1.0 / s, "peak": [1.0, float("inf")]})
    w.close()
    rows = [json.loads(l) for l in p.read_text().splitlines()]
    assert rows[2]["loss"] is None and rows[0]["peak"] == [1.0, None]
    truncate_after(p, 3)
    assert [json.loads(l)["step"] for l in p.read_text().splitlines()] == [1, 2, 3]
