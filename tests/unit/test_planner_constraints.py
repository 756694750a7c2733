"""Every constraint of the planner comes back as `valid: false` with an error naming the field to change."""
import copy

import pytest

from plan import catalog, estimate, max_seq_len
from tests.plans import QWEN3_4B_SP4

BASE = QWEN3_4B_SP4


def variant(**changes):
    p = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        if "__" not in dotted:
            p[dotted] = value
            continue
        section, key = dotted.split("__")
        p[section][key] = value
    return p


def fields(e):
    return [x["field"] for x in e["errors"]]


def assert_invalid(e, field):
    assert e["valid"] is False
    assert e["memory"] is None
    assert e["throughput"] is None
    assert field in fields(e), e["errors"]


def test_base_plan_is_valid():
    e = estimate(BASE)
    assert e["valid"] is True
    assert e["errors"] == []
    assert e["memory"]["peak_allocated_gib"] > 0


def test_seq_len_not_divisible_by_sp():
    e = estimate(variant(training__seq_len=32771))
    assert_invalid(e, "training.seq_len")
    assert "32771" in e["errors"][0]["message"]
    assert "4" in e["errors"][0]["message"]


def test_heads_not_divisible_by_sp():
    e = estimate(variant(parallel__sp_size=3, hardware__gpus_per_node=3, training__seq_len=24576))
    assert_invalid(e, "parallel.sp_size")
    assert any("num_attention_heads (32) is not divisible by sp_size (3)" in x["message"] for x in e["errors"])


def test_kv_heads_incompatible_with_sp():
    # Llama-3.1-8B: 32 heads, 8 kv heads; sp=16 divides 32 and 8 divides 16 -> fine; a custom 12-kv-head model
    # with 48 heads at sp=8: 48 % 8 == 0 but neither 12 % 8 nor 8 % 12 is 0.
    cfg = {"hidden_size": 3072, "num_hidden_layers": 2, "num_attention_heads": 48, "num_key_value_heads": 12,
           "intermediate_size": 8192, "vocab_size": 32000}
    e = estimate(variant(model={"config": cfg}, parallel__sp_size=8, hardware__gpus_per_node=8))
    assert_invalid(e, "parallel.sp_size")
    assert any("num_key_value_heads (12)" in x["message"] for x in e["errors"])
    ok = estimate(variant(model={"config": cfg}, parallel__sp_size=16 // 4 * 3, hardware__gpus_per_node=12,
                          training__seq_len=12 * 1024))
    assert ok["valid"] is True, ok["errors"]          # sp=12: kv 12 % 12 == 0


def test_kv_heads_replicated_when_sp_is_a_multiple():
    e = estimate(variant(model={"preset": "meta-llama/Llama-3.1-8B"}, parallel__sp_size=16, hardware__gpus_per_node=16))
    assert e["valid"] is True, e["errors"]             # 8 kv heads, sp 16: 16 % 8 == 0 -> replicated


def test_sp_larger_than_heads():
    e = estimate(variant(model={"preset": "meta-llama/Llama-3.1-8B"}, parallel__sp_size=64, hardware__gpus_per_node=64,
                         training__seq_len=65536))
    assert_invalid(e, "parallel.sp_size")
    assert any("exceeds num_attention_heads (32)" in x["message"] for x in e["errors"])


def test_world_size_mismatch():
    e = estimate(variant(hardware__gpus_per_node=8))
    assert_invalid(e, "parallel.dp_size")
    assert any("4 x 1 = 4" in x["message"] and "8 x 1 = 8" in x["message"] for x in e["errors"])
    assert estimate(variant(hardware__gpus_per_node=2, hardware__num_nodes=2))["valid"] is True


def test_unknown_preset_lists_known():
    e = estimate(variant(model={"preset": "no/such-model"}))
    assert_invalid(e, "model.preset")
    assert "Qwen/Qwen3-4B" in e["errors"][0]["message"]


def test_missing_model():
    e = estimate({k: v for k, v in BASE.items() if k != "model"})
    assert_invalid(e, "model")


def test_bad_model_config():
    e = estimate(variant(model={"config": {"hidden_size": 64}}))
    assert_invalid(e, "model.config.num_hidden_layers")
    assert "required" in e["errors"][0]["message"]


def test_unknown_gpu_lists_known():
    e = estimate(variant(hardware__gpu="Z9000"))
    assert_invalid(e, "hardware.gpu")
    msg = e["errors"][0]["message"]
    assert all(name in msg for name in ("A100-80GB", "H100-80GB", "H200-141GB"))
    assert "'Z9000'" in msg


def test_missing_gpu_is_required_not_unknown():
    plan = variant()
    del plan["hardware"]["gpu"]
    e = estimate(plan)
    assert_invalid(e, "hardware.gpu")
    msg = e["errors"][0]["message"]
    assert msg.startswith("hardware.gpu is required;")
    assert "H100-80GB" in msg
    assert "None" not in msg


def test_custom_gpu_object():
    gpu = {"name": "MyGPU-96", "memory_gib": 96, "hbm_tb_per_s": 4.0, "bf16_dense_tflops": 1000,
           "nvlink_gb_per_s_per_direction": 450, "typical_internode_gb_per_s": 50}
    e = estimate(variant(hardware__gpu=gpu))
    assert e["valid"] is True
    assert e["memory"]["gpu_capacity_gib"] == 96
    bad = estimate(variant(hardware__gpu={"name": "x", "memory_gib": 96}))
    assert bad["valid"] is False
    assert bad["memory"] is None
    assert sorted(fields(bad)) == sorted(f"hardware.gpu.{c}" for c in ("hbm_tb_per_s", "bf16_dense_tflops",
                                                                      "nvlink_gb_per_s_per_direction",
                                                                      "typical_internode_gb_per_s"))


def test_one_error_per_broken_rule():
    e = estimate(variant(hardware__gpu="Z9000", training__seq_len=32771, hardware__gpus_per_node=8))
    assert sorted(fields(e)) == ["hardware.gpu", "parallel.dp_size", "training.seq_len"]


@pytest.mark.parametrize("plan,field", [
    (variant(training__zero_stage=5), "training.zero_stage"),
    (variant(training__dtype="int8"), "training.dtype"),
    (variant(training__attn_implementation="magic"), "training.attn_implementation"),
    (variant(training__attn_implementation="eager"), "training.attn_implementation"),  # Ulysses rejects eager
    (variant(training__offload_params=True, training__zero_stage=2), "training.offload_params"),
    (variant(training__checkpoint_offload=True, training__activation_checkpointing=False),
     "training.checkpoint_offload"),
    (variant(training__micro_batch_size=0), "training.micro_batch_size"),
    (variant(training__grad_accum="8"), "training.grad_accum"),
    (variant(parallel__sp_size=-4), "parallel.sp_size"),
    (variant(training__tiled_mlp="yes"), "training.tiled_mlp"),
])
def test_malformed_fields(plan, field):
    assert_invalid(estimate(plan), field)


@pytest.mark.parametrize("plan", [None, [], "x", 3, {"model": 1, "hardware": "h100", "parallel": [], "training": 7}])
def test_garbage_never_raises(plan):
    e = estimate(plan)
    assert e["valid"] is False
    assert e["errors"]


def test_warning_beyond_max_position_embeddings():
    e = estimate(variant(training__seq_len=65536))     # Qwen3-4B: 40960 positions
    assert e["valid"] is True
    assert any(w["field"] == "training.seq_len" and "RoPE" in w["message"] for w in e["warnings"])
    assert estimate(variant(training__seq_len=32768))["warnings"] == []


def test_catalog_covers_reference_models_and_gpus():
    c = catalog.listing()
    names = {m["name"] for m in c["models"]}
    assert {"Qwen/Qwen3-4B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"} <= names
    assert {g["name"] for g in c["gpus"]} >= {"A100-40GB", "H100-80GB", "H200-141GB", "B200-180GB"}


def test_document_len_cannot_exceed_seq_len():
    assert_invalid(estimate(variant(training__document_len=40000)), "training.document_len")
    assert estimate(variant(training__document_len=4096))["valid"] is True


@pytest.mark.parametrize("key,value", [("hidden_size", 10**400), ("hidden_size", 1e300), ("vocab_size", 1 << 40),
                                       ("num_hidden_layers", 2.5), ("num_attention_heads", True),
                                       ("num_key_value_heads", 10**6), ("intermediate_size", "big")])
def test_config_sizes_out_of_range_name_the_key_and_never_overflow(key, value):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, key: value}
    for answer in (estimate(variant(model={"config": cfg})), max_seq_len(variant(model={"config": cfg}))["estimate"]):
        assert_invalid(answer, f"model.config.{key}")


@pytest.mark.parametrize("column,value", [("memory_gib", 1e308), ("hbm_tb_per_s", 1e-300),
                                          ("bf16_dense_tflops", 1e-300), ("typical_internode_gb_per_s", 0)])
def test_custom_gpu_figures_out_of_range_are_errors_not_infinities(column, value):
    gpu = {"name": "g", "memory_gib": 96, "hbm_tb_per_s": 4.0, "bf16_dense_tflops": 1000,
           "nvlink_gb_per_s_per_direction": 450, "typical_internode_gb_per_s": 50, column: value}
    assert_invalid(estimate(variant(hardware__gpu=gpu)), f"hardware.gpu.{column}")
