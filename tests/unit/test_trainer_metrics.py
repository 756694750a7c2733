"""Metrics pieces: the CPU tensor-memory tracker, the FLOPs formula, the JSONL writer and resume truncation."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig

from backend.planner.catalog import gpus, model_from_config, models
from backend.planner.throughput import flops_per_token as planner_flops_per_token
from backend.planner.throughput import model_flops_per_token
from backend.planner.validate import parse
from tests.boundaries import packages_loaded
from tests.plans import qwen_plan
from worker.trainer.metrics import (PEAK_BF16_TFLOPS, MetricsWriter, TensorMemoryTracker, flops_per_token,
                                    truncate_after)

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


@pytest.mark.parametrize("name", sorted(models()))
def test_trainer_flops_equal_the_planners_for_every_preset(name):
    m = models()[name]
    cfg = LlamaConfig(hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
                      num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                      head_dim=m.head_dim, intermediate_size=m.intermediate_size, vocab_size=m.vocab_size,
                      tie_word_embeddings=m.tie_word_embeddings)
    for seq_len in (4096, 1_000_000):
        assert flops_per_token(cfg, seq_len) == model_flops_per_token(m, seq_len), (name, seq_len)


def test_trainer_flops_equal_the_planners_for_mixtures_of_experts():
    moe = [Qwen3MoeConfig(hidden_size=256, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=32, intermediate_size=1024, moe_intermediate_size=96, num_experts=16,
                          num_experts_per_tok=4, vocab_size=1000),
           MixtralConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=512, num_local_experts=8, num_experts_per_tok=2, vocab_size=1000)]
    for cfg in moe:
        planner = model_flops_per_token(model_from_config(cfg.to_dict()), 8192)
        assert planner > 0 and flops_per_token(cfg, 8192) == planner, cfg.model_type
    # by hand, the first: per layer q,o 2*256*256 + k,v 2*256*64, the 4 routed experts of width 96 as one SwiGLU
    # MLP 3*256*(4*96) and the router 256*16 (the other 12 experts cost no FLOPs); plus lm_head 256*1000
    n = 3 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 4 * 96 + 256 * 16) + 256 * 1000
    assert flops_per_token(moe[0], 8192) == 6 * n + 6 * 3 * 8 * 32 * 8192


def test_trainer_peak_tflops_equal_the_planners_gpu_catalog():
    assert PEAK_BF16_TFLOPS == {name: g.bf16_dense_tflops for name, g in gpus().items()}


def test_trainer_does_not_import_the_backend():
    # DESIGN.md: the trainer runs alone (`ulab train` on a GPU node); it shares formulas with the planner by
    # the tests above, not by import
    assert packages_loaded("import worker.trainer.train, worker.trainer.cli", ("backend",)) == []


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
