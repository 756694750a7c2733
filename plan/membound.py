"""Memory-bound work of a step: the elementwise kernels between the matmuls (RMSNorm, RoPE, SwiGLU, the residual
adds) and the fp32 loss, timed at the GPU's HBM bandwidth (plan/data/gpus.csv `hbm_tb_per_s`).

Bytes per element are counted from the eager code each kernel runs, one read or write of a tensor per op:
- RMSNorm, Transformers (models/llama/modeling_llama.py LlamaRMSNorm.forward, lines 61-66): `.to(float32)` (read B,
  write 4), `pow(2)` (4 + 4), `mean` (read 4), `* rsqrt` (4 + 4), `.to(input_dtype)` (4 + B), `weight *` (B + B):
  28 + 4B bytes per element. Qwen3's q_norm/k_norm are the same module on q and k.
- RoPE (apply_rotary_pos_emb / rotate_half, lines 119-150) on q and k: `q * cos` (B + B), rotate_half's negated
  slice and `cat` (B + B), `* sin` (B + B), the add (2B + B): 9B per element.
- SwiGLU (LlamaMLP.forward, line 164): `act_fn(gate)` (B + B) and `* up` (2B + B) over the MLP width: 5B.
- The two residual adds (decoder layer, lines 306 and 312): 3B per hidden element each.
- The loss (transformers/loss/loss_utils.py ForCausalLMLoss: `logits.float()`, then cross_entropy's log_softmax
  with its max and sum reductions, nll): the upcast (B + 4), log_softmax (two reductions and the output: 4 + 4 + 4 +
  4) = 20 + B per vocabulary entry; `upcast_logits: false` keeps them in the model's dtype (4B + B).
- Liger's kernels (liger_kernel) fuse each into one pass: RMSNorm and RoPE read and write once (2B), SwiGLU reads
  gate and up and writes the product (3B); its fused linear cross-entropy never materializes the logits beyond a
  chunk it writes and rewrites in place (3B per vocabulary entry).
A backward reads the saved input and the output's gradient and writes the input's gradient: twice the forward's
bytes, for the eager ops and Liger's alike. Activation checkpointing runs the layer's forward once more.
"""
from __future__ import annotations

# HBM streaming reaches about 80% of the datasheet bandwidth (STREAM-like copy kernels, NVIDIA's H100 / A100
# bandwidth tests); also the GPU optimizer step's rate (plan/throughput.py).
HBM_EFFICIENCY = 0.8


def _layer_forward_bytes(spec) -> float:
    """Bytes per token the elementwise kernels of one decoder layer move in its forward."""
    m, B = spec.model, spec.dtype_bytes
    h, qk = m.hidden_size, m.q_dim + m.kv_dim                # RoPE (and Qwen3's norms) on q and k
    if spec.liger_kernel:
        norm, rope, swiglu = 2 * B, 2 * B, 3 * B
    else:
        norm, rope, swiglu = 28 + 4 * B, 9 * B, 5 * B
    total = 2 * norm * h + rope * qk + swiglu * m.mlp_width + 2 * 3 * B * h
    if m.qk_norm:
        total += norm * qk
    return total


def _loss_bytes(spec) -> float:
    """Bytes per token of the loss over the vocabulary, forward and backward."""
    m, B = spec.model, spec.dtype_bytes
    if spec.liger_fused_loss:
        per_entry = 3 * B
    else:
        per_entry = 20 + B if spec.upcast_logits else 5 * B
    return 3 * per_entry * m.vocab_size                      # forward + backward (twice the forward)


def memory_bound_s(spec) -> dict:
    """Seconds of memory-bound work per micro batch: {"layer": one decoder layer, "loss": the loss}."""
    bw = spec.gpu.hbm_tb_per_s * 1e12 * HBM_EFFICIENCY
    passes = 3 + (1 if spec.activation_checkpointing else 0)  # forward, backward (2x), recompute
    t = spec.local_tokens
    return {"layer": t * passes * _layer_forward_bytes(spec) / bw, "loss": t * _loss_bytes(spec) / bw}
