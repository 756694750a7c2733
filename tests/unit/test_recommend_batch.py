"""Recommend compares like with like: every option trains the plan's global batch (sequences and tokens per
optimizer step, grad_accum adjusted) unless asked to vary it, and each states its step time with its range, its
tokens per step, its time per billion tokens and the kernels it needs."""
import json

from typer.testing import CliRunner

from backend.cli import app as ulab
from plan import recommend

# Llama-3.1-8B at 128K on 4 x 8 H100 with 8 micro batches per step: 8 sequences of 131,072 tokens per step
LLAMA_128K = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
              "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4},
              "training": {"seq_len": 131072, "grad_accum": 8}}


def _batch(rec: dict) -> tuple[int, int]:
    t, p = rec["estimate"]["throughput"], rec["plan"]
    tr = p["training"]
    assert t["sequences_per_step"] == tr["micro_batch_size"] * tr["grad_accum"] * p["parallel"]["dp_size"]
    assert t["tokens_per_step"] == t["sequences_per_step"] * tr["seq_len"]
    return t["sequences_per_step"], t["tokens_per_step"]


def test_every_option_trains_the_plans_global_batch():
    answer = recommend(LLAMA_128K)
    recs = answer["recommendations"]
    assert len(recs) >= 3, answer
    assert answer["global_batch"] == 8
    assert {_batch(r) for r in recs} == {(8, 8 * 131072)}
    assert len({r["plan"]["parallel"]["dp_size"] for r in recs}) > 1, "the layouts differ, the batch does not"
    steps = [r["estimate"]["throughput"]["step_time_s"] for r in recs]
    assert steps == sorted(steps)                        # the same tokens per step: faster is better
    # a layout whose dp does not divide 8 sequences is named among the rejected, with the way out
    misses = [r for r in answer["rejected"] if "does not divide the global batch of 8" in r["why"]]
    assert {r["plan"]["parallel"]["dp_size"] for r in misses} == {16, 32}, answer["rejected"]


def test_varying_the_batch_is_asked_for_and_said():
    answer = recommend(LLAMA_128K, vary_batch=True)
    assert answer["global_batch"] is None
    batches = {_batch(r)[0] for r in answer["recommendations"]}
    assert len(batches) > 1, batches
    assert max(batches) > 8, batches
    held = recommend(LLAMA_128K, global_batch=32)
    assert {_batch(r)[0] for r in held["recommendations"]} == {32}, held["recommendations"]


def test_each_card_states_step_time_tokens_per_step_time_per_billion_and_kernels():
    for rec in recommend(LLAMA_128K)["recommendations"]:
        t = rec["estimate"]["throughput"]
        lo, hi = t["step_time_s_range"]
        assert lo < t["step_time_s"] < hi
        blo, bhi = t["time_per_billion_tokens_s_range"]
        assert abs(t["time_per_billion_tokens_s"] - 1e9 / t["tokens_per_s"]) / t["time_per_billion_tokens_s"] < 1e-3
        assert blo < t["time_per_billion_tokens_s"] < bhi
        attn = rec["plan"]["training"]["attn_implementation"]
        assert rec["kernels"] == [attn] + (["liger_kernel"] if rec["plan"]["training"]["liger_kernel"] else [])
        assert rec["missing_kernels"] == []                 # no queue known: nothing lacks
        assert rec["unavailable"] is None
        assert any(r.startswith("global batch 8 sequences (1,048,576 tokens) per step") for r in rec["reasons"])


def test_a_queue_without_fa3_puts_fa3_options_last_with_the_reason():
    plan = {**LLAMA_128K, "parallel": {"sp_size": 8, "dp_size": 4},
            "training": {**LLAMA_128K["training"], "zero_stage": 3, "liger_kernel": False}}
    recs = recommend(plan, kernels=["flash_attention_2", "sdpa"])["recommendations"]
    attns = [r["plan"]["training"]["attn_implementation"] for r in recs]
    assert attns == sorted(attns), attns
    assert (attns[0], attns[-1]) == ("flash_attention_2", "flash_attention_3"), attns
    fa3 = recs[attns.index("flash_attention_3")]
    # FA3 is faster (tokens/s would rank it first) but the queue cannot run it
    assert fa3["estimate"]["throughput"]["tokens_per_s"] > recs[0]["estimate"]["throughput"]["tokens_per_s"]
    assert fa3["missing_kernels"] == ["flash_attention_3"]
    assert fa3["unavailable"] == ("needs flash_attention_3, which no live worker of the plan's queue has (they have "
                                  "flash_attention_2, sdpa)")


def test_the_cli_holds_the_batch_and_varies_it_with_the_flag(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(LLAMA_128K))
    held = CliRunner().invoke(ulab, ["plan", "--json", str(f), "--recommend"])
    assert held.exit_code == 0, held.output
    assert {_batch(r)[0] for r in json.loads(held.output)["recommendations"]} == {8}
    varied = CliRunner().invoke(ulab, ["plan", "--json", str(f), "--recommend", "--vary-batch"])
    assert max(_batch(r)[0] for r in json.loads(varied.output)["recommendations"]) > 8
    text = CliRunner().invoke(ulab, ["plan", "--json", str(f), "--recommend", "--text"]).output
    assert "for 1.0M tokens (8 sequences)" in text, text
    assert "per billion tokens" in text, text
    assert "needs flash_attention" in text, text


def test_a_plan_that_states_no_batch_has_none_to_hold():
    """Llama-3.1-8B (32 heads: sp at most 32) on 64 GPUs with neither grad_accum nor dp_size set: no layout trains
    one sequence per step on 64 GPUs, so holding the defaulted batch of 1 would reject every option. The plan
    states no batch, so each option trains its own and says which."""
    plan = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
            "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 8}, "training": {"seq_len": 131072}}
    answer = recommend(plan)
    assert answer["recommendations"], answer["rejected"][:3]
    assert answer["global_batch"] is None
    assert all(_batch(r)[0] >= 2 for r in answer["recommendations"])  # dp >= 2 at sp <= 32 on 64 GPUs
