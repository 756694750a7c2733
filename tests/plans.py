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


# ALST paper (Bekman et al. 2025, arXiv:2506.13996), abstract: Llama-8B trains at 500K tokens on one H100, 3.7M on
# one 8 x H100 node and over 15M on 4 nodes, against a 32K baseline. (gpus_per_node, nodes) -> published max tokens.
ALST_PUBLISHED = {(1, 1): 500_000, (8, 1): 3_700_000, (8, 4): 15_000_000}
ALST_BASELINE = 32_768


def alst_plan(gpus_per_node: int, num_nodes: int, alst: bool = True, **training) -> dict:
    """Llama-3.1-8B on H100-80GB nodes as the ALST paper trains it (Bekman et al. 2025, arXiv:2506.13996): ZeRO-3,
    optimizer states offloaded to CPU, activation checkpointing, flash attention 2, micro batch 1. With `alst`:
    Ulysses SP over every GPU, tiled MLP, tiled logits loss and the checkpoints offloaded to CPU; without: the
    paper's baseline, plain data parallelism over every GPU."""
    world = gpus_per_node * num_nodes
    sp = world if alst else 1
    plan = copy.deepcopy(QWEN3_4B_SP4)
    plan["model"] = {"preset": "meta-llama/Llama-3.1-8B"}
    plan["hardware"].update(gpus_per_node=gpus_per_node, num_nodes=num_nodes)
    plan["parallel"] = {"sp_size": sp, "dp_size": world // sp}
    plan["training"].update({"seq_len": 8192, "grad_accum": 1, "checkpoint_offload": alst, "tiled_mlp": alst,
                             "tiled_logits_loss": alst, **training})
    return plan
