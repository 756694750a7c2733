"""The reference plan of the planner tests and benches: Qwen3-4B on 4 x H100-80GB, SP=4, 32K, the blog's setup
(ZeRO-3, optimizer offload, activation checkpointing, flash attention, grad accumulation 8)."""
import copy

QWEN3_4B_SP4 = {
    "model": {"preset": "Qwen/Qwen3-4B"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 1, "cpu_memory_gib_per_node": 1900},
    "parallel": {"sp_size": 4, "dp_size": 1},
    "training": {"seq_len": 32768, "micro_batch_size": 1, "grad_accum": 8, "dtype": "bf16", "zero_stage": 3,
                 "offload_optimizer": True, "offload_params": False, "activation_checkpointing": True,
                 "checkpoint_offload": False, "tiled_mlp": False, "tiled_logits_loss": False,
                 "attn_implementation": "flash_attention_2"},
}


def qwen_plan(**training) -> dict:
    """A fresh copy of the reference plan with some `training` fields changed."""
    plan = copy.deepcopy(QWEN3_4B_SP4)
    plan["training"].update(training)
    return plan
