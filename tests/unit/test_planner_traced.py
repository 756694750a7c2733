"""The analytical activation + logits terms agree with a FakeTensorMode trace of the real HF model.

Small shapes (FakeTensorMode allocates nothing; the cost is Python dispatch), chosen so that different terms
dominate: the logits/loss phase, the recomputed layer under checkpointing, every layer's saved tensors without
checkpointing, GQA kv replication under emulated Ulysses (kv_heads < sp_size) and Qwen3's q/k norms.
"""
import warnings

import pytest

pytest.importorskip("transformers")

from plan import traced_estimate


def plan(cfg, sp, seq, ac, attn="sdpa", liger=False):
    return {"model": {"config": cfg}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": sp},
            "parallel": {"sp_size": sp, "dp_size": 1},
            "training": {"seq_len": seq, "dtype": "bf16", "zero_stage": 3, "activation_checkpointing": ac,
                         "attn_implementation": attn, "liger_kernel": liger}}


QWEN_BIG_VOCAB = {"model_type": "qwen3", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 8,
                  "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 688, "vocab_size": 4096}
QWEN_SMALL_VOCAB = {**QWEN_BIG_VOCAB, "num_hidden_layers": 4, "intermediate_size": 1024, "vocab_size": 256}
LLAMA = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "head_dim": 32, "intermediate_size": 1024, "vocab_size": 256}

SHAPES = [
    ("logits-bound, checkpointing", QWEN_BIG_VOCAB, 1, 1024, True, "sdpa"),
    ("layer-bound, checkpointing, sp=4 with kv replication", QWEN_SMALL_VOCAB, 4, 4096, True, "sdpa"),
    ("no checkpointing, sp=1", QWEN_SMALL_VOCAB, 1, 1024, False, "sdpa"),
    ("no checkpointing, llama, sp=4", LLAMA, 4, 2048, False, "sdpa"),
    ("checkpointing, llama, sp=8 (kv 4 -> 8)", LLAMA, 8, 4096, True, "sdpa"),
    ("eager attention: O(S^2) scores", LLAMA, 1, 1024, True, "eager"),
]


@pytest.mark.parametrize("name,cfg,sp,seq,ac,attn", SHAPES, ids=[s[0] for s in SHAPES])
def test_traced_matches_analytical(name, cfg, sp, seq, ac, attn):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = traced_estimate(plan(cfg, sp, seq, ac, attn))
    assert r["valid"] is True
    traced, analytical = r["traced_activation_peak_gib"], r["analytical_activation_peak_gib"]
    assert traced > 0
    assert abs(analytical - traced) / traced < 0.10, (name, traced * 1024, analytical * 1024)


def test_traced_sees_checkpointing():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        on = traced_estimate(plan(QWEN_SMALL_VOCAB, 1, 1024, True))["traced_activation_peak_gib"]
        off = traced_estimate(plan(QWEN_SMALL_VOCAB, 1, 1024, False))["traced_activation_peak_gib"]
    assert on < 0.5 * off


# Liger on and off on three shapes. Liger's kernels are Triton (CUDA only) and cannot run under FakeTensorMode on a
# CPU: plan.traced_liger replays each Liger Function's allocations and saved tensors (cited from liger-kernel's
# source) inside the real HF model, so this checks the analytical Liger terms against those pieces.
LIGER_SHAPES = [
    ("logits-bound, checkpointing", QWEN_BIG_VOCAB, 1, 1024, True),
    ("layer-bound, checkpointing, sp=4 with kv replication", QWEN_SMALL_VOCAB, 4, 4096, True),
    ("no checkpointing, llama, sp=4", LLAMA, 4, 2048, False),
]


@pytest.mark.parametrize("liger", [False, True], ids=["hf", "liger"])
@pytest.mark.parametrize("name,cfg,sp,seq,ac", LIGER_SHAPES, ids=[s[0] for s in LIGER_SHAPES])
def test_traced_matches_analytical_liger_on_and_off(name, cfg, sp, seq, ac, liger):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = traced_estimate(plan(cfg, sp, seq, ac, liger=liger))
    traced, analytical = r["traced_activation_peak_gib"], r["analytical_activation_peak_gib"]
    assert abs(analytical - traced) / traced < 0.10, (name, liger, traced * 1024, analytical * 1024)


def test_traced_liger_uses_less_than_hf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = traced_estimate(plan(QWEN_BIG_VOCAB, 1, 1024, True))["traced_activation_peak_gib"]
        lk = traced_estimate(plan(QWEN_BIG_VOCAB, 1, 1024, True, liger=True))["traced_activation_peak_gib"]
    assert lk < 0.5 * hf                                # the logits never exist in full


def traced_gib(cfg, sp, seq, **training):
    p = plan(cfg, sp, seq, True, liger=training.pop("liger", False))
    p["training"].update(training)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = traced_estimate(p)
    assert r["valid"] is True
    assert r["not_traced"] == [], r
    return r["traced_activation_peak_gib"], r["analytical_activation_peak_gib"]


def test_the_trace_holds_no_s_squared_causal_mask():
    """The wrapped attention is causal without a mask, as flash attention on the GPU: doubling the sequence doubles
    the traced peak, with no S x S boolean mask on top."""
    short, _ = traced_gib(LLAMA, 1, 2048, liger=True)
    long, _ = traced_gib(LLAMA, 1, 4096, liger=True)
    assert long / short < 2.03, (short * 1024, long * 1024)


def test_tiled_mlp_and_checkpoint_offload_are_traced():
    """DeepSpeed's TiledMLP and the checkpoint offload run in the trace; the planner is not below either."""
    liger, _ = traced_gib(LLAMA, 1, 4096, liger=True)
    tiled, tiled_planned = traced_gib(LLAMA, 1, 4096, liger=True, tiled_mlp=True)
    offload, offload_planned = traced_gib(LLAMA, 1, 4096, liger=True, tiled_mlp=True, checkpoint_offload=True)
    assert tiled < liger, (liger * 1024, tiled * 1024)
    assert offload < tiled, (tiled * 1024, offload * 1024)
    assert tiled_planned >= 0.95 * tiled
    assert offload_planned >= 0.95 * offload
