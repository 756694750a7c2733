"""Metrics pieces: the CPU tensor-memory tracker, the FLOPs formula, the JSONL writer and resume truncation."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, MixtralConfig, Qwen3Config, Qwen3MoeConfig

from plan.catalog import gpus, model_from_config, models
from plan.throughput import flops_per_token as planner_flops_per_token
from plan.validation import validate
from tests.boundaries import packages_loaded
from tests.plans import qwen_plan
from worker.trainer.metrics import MetricsWriter, TensorMemoryTracker, flops_per_token, peak_tflops

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
    assert t.peak == 6 * MIB
    assert t.peak_created == 6 * MIB
    del b, c


def test_tracker_registers_existing_state_without_counting_it_as_created():
    w = torch.zeros(MIB, dtype=torch.uint8)
    with TensorMemoryTracker() as t:
        t.register([w, w])
        x = torch.ones(MIB, dtype=torch.uint8)
    assert t.peak == 2 * MIB
    assert t.peak_created == MIB
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
    spec = validate(qwen_plan(seq_len=32768)).spec
    assert flops_per_token(cfg, 32768) == planner_flops_per_token(spec)["model"]


def test_trainer_counts_attention_over_the_document_like_the_planner():
    # packed documents: attention FLOPs follow document_len, in the trainer's TFLOPS and the planner's alike
    cfg = SimpleNamespace(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=128, vocab_size=512)
    n = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 64 * 512
    assert flops_per_token(cfg, 4096, document_len=256) == 6 * n + 6 * 2 * 4 * 16 * 256
    assert flops_per_token(cfg, 4096, document_len=None) == 6 * n + 6 * 2 * 4 * 16 * 4096
    qwen = models()["Qwen/Qwen3-4B"]
    spec = validate(qwen_plan(seq_len=32768, document_len=2048)).spec
    assert planner_flops_per_token(spec)["model"] == qwen.flops_per_token(2048)


@pytest.mark.parametrize("name", sorted(models()))
def test_trainer_flops_equal_the_planners_for_every_preset(name):
    m = models()[name]
    cfg = LlamaConfig(hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
                      num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                      head_dim=m.head_dim, intermediate_size=m.intermediate_size, vocab_size=m.vocab_size,
                      tie_word_embeddings=m.tie_word_embeddings)
    for seq_len in (4096, 1_000_000):
        assert flops_per_token(cfg, seq_len) == m.flops_per_token(seq_len), (name, seq_len)


def test_trainer_flops_equal_the_planners_for_mixtures_of_experts():
    moe = [Qwen3MoeConfig(hidden_size=256, num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                          head_dim=32, intermediate_size=1024, moe_intermediate_size=96, num_experts=16,
                          num_experts_per_tok=4, vocab_size=1000),
           MixtralConfig(hidden_size=256, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
                         intermediate_size=512, num_local_experts=8, num_experts_per_tok=2, vocab_size=1000)]
    for cfg in moe:
        planner = model_from_config(cfg.to_dict()).flops_per_token(8192)
        assert planner > 0, cfg.model_type
        assert flops_per_token(cfg, 8192) == planner, cfg.model_type
    # by hand, the first: per layer q,o 2*256*256 + k,v 2*256*64, the 4 routed experts of width 96 as one SwiGLU
    # MLP 3*256*(4*96) and the router 256*16 (the other 12 experts cost no FLOPs); plus lm_head 256*1000
    n = 3 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 4 * 96 + 256 * 16) + 256 * 1000
    assert flops_per_token(moe[0], 8192) == 6 * n + 6 * 3 * 8 * 32 * 8192


def test_trainer_peak_tflops_is_the_plans_gpu(monkeypatch):
    # MFU's denominator: the catalog's figure for the plan's GPU (or its custom object), at the plan's dtype
    for name, g in gpus().items():
        spec = validate(qwen_plan(seq_len=32768) | {"hardware": {"gpu": name, "gpus_per_node": 4}}).spec
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        assert peak_tflops(spec) == g.bf16_dense_tflops
        fp32 = spec.with_(dtype="fp32")
        assert peak_tflops(fp32) == g.bf16_dense_tflops / 2  # TF32, as the planner counts it
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        assert peak_tflops(spec) is None  # CPU ranks: no MFU


def test_trainer_does_not_import_the_backend():
    # DESIGN.md: the trainer runs alone (`ulab train` on a GPU node); it shares the formulas with the planner
    # through the plan package, which imports nothing of ours
    assert packages_loaded("import worker.trainer.train, worker.trainer.launcher", ("backend",)) == []


def test_writer_keeps_lines_valid_json(tmp_path):
    p = tmp_path / "metrics.jsonl"
    w = MetricsWriter(p)
    for s in range(1, 6):
        w.write({"step": s, "loss": float("nan") if s == 3 else 1.0 / s, "peak": [1.0, float("inf")]})
    w.close()
    rows = [json.loads(line) for line in p.read_text().splitlines()]
    assert rows[2]["loss"] is None
    assert rows[0]["peak"] == [1.0, None]


def test_a_fetched_batch_counts_its_own_bytes_not_the_whole_dataset():
    """PackedRows hands out copies of its rows: a view would carry the whole stage's storage, which the CPU meter
    counts (1.4 MiB for 238 rows of 256 tokens, against 6 KiB for the batch)."""
    import numpy as np
    from transformers import default_data_collator

    from worker.trainer.metrics import TensorMemoryTracker
    from worker.trainer.sp_trainer import PackedRows

    rows = {k: np.zeros((238, 256), dtype=np.int64) for k in ("input_ids", "position_ids", "labels")}
    dataset = PackedRows(rows, offset=0, length=10)
    tracker = TensorMemoryTracker()
    with tracker:
        batch = default_data_collator([dataset[0]])
    assert batch["input_ids"].shape == (1, 256)
    assert tracker.peak_created <= 2 * 3 * 256 * 8, tracker.peak_created
