"""Model configs and data for `make gpu-check` (bench/gpu_check.py): random weights, no downloads."""
from __future__ import annotations

import random
from pathlib import Path

# ~150M parameters: the suite's runs start and train in seconds
SUITE_MODEL = {"model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16,
               "num_key_value_heads": 8, "intermediate_size": 2816, "vocab_size": 32000,
               "max_position_embeddings": 131072, "rope_theta": 500000.0}
# Llama-3.2-1B's shape (config.json of meta-llama/Llama-3.2-1B): 1.24B parameters
LLAMA_1B = {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
            "max_position_embeddings": 131072, "rope_theta": 500000.0}
# Llama-3.1-8B's layer shape (config.json of meta-llama/Llama-3.1-8B) with 4 of its 32 layers, so that one GPU
# holds it without offloading a whole 8B model; the planner predicts the same 4-layer config
LLAMA_8B_4_LAYERS = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 4, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0}

WORDS = ("sequence parallel attention heads trade tokens across ranks while zero shards optimizer states "
         "gradients and parameters and tiled compute keeps activations small").split()


def write_long_documents(path: Path, *, doc_len: int, total: int) -> Path:
    """Documents of exactly doc_len bytes (ASCII words), separated by blank lines, about `total` bytes in all."""
    rng = random.Random(0)
    docs = []
    for _ in range(max(1, total // doc_len)):
        words: list[str] = []
        n = 0
        while n < doc_len:
            w = rng.choice(WORDS)
            words.append(w)
            n += len(w) + 1
        docs.append(" ".join(words)[:doc_len].rstrip().ljust(doc_len, "x"))
    path.write_text("\n\n".join(docs) + "\n")
    return path

# `make gpu-rehearsal` (bench/gpu_check.py --cpu): the check's every part on CPU ranks in seconds per row
CPU_MODEL = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 4096}
# a custom device just under the 2048-token sweep rows (and SP=2) so they are predicted not to fit: they run last
CPU_GPU = {"name": "cpu-rehearsal", "memory_gib": 0.575, "hbm_tb_per_s": 0.05, "bf16_dense_tflops": 1,
           "nvlink_gb_per_s_per_direction": 5, "typical_internode_gb_per_s": 1}
