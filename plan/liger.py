"""What Liger kernels (`training.liger_kernel`, Transformers' `use_liger_kernel`) save for backward and allocate,
per token, read from liger-kernel 0.8.5's source. Transformers calls `_apply_liger_kernel_to_instance`, which for
Llama/Qwen/Mistral models swaps in LigerRMSNorm (every norm, Qwen3's q_norm/k_norm included), LigerSwiGLUMLP, Liger
RoPE and the fused linear cross-entropy forward (`transformers/monkey_patch.py` apply_liger_kernel_to_llama /
_qwen3: rope, rms_norm, swiglu, fused_linear_cross_entropy all default True).

Notation as in plan.memory: B bytes of the training dtype, h hidden, I the MLP width, V vocab, t tokens on a rank.
Liger's kernels are Triton (CUDA only): the FakeTensor trace cannot run them, so plan.traced replays each Function's
allocations and saved tensors (the lines cited here) with torch ops of the same sizes.
"""
from __future__ import annotations

# ops/rms_norm.py rms_norm_forward: RSTD = torch.empty(n_rows, dtype=float32) in the "llama" casting mode (the
# mode LigerRMSNorm uses for Llama/Qwen): one fp32 inverse RMS per row.
RSTD_BYTES = 4
# ops/fused_linear_cross_entropy.py: _CHUNK_MEM_CONST = 1, i.e. transient logits of about BT x H elements.
FLCE_CHUNK_MEM_CONST = 1


def norm_saved(n: int, B: int, input_is_saved_elsewhere: bool) -> int:
    """Bytes per row LigerRMSNormFunction.forward keeps: ctx.save_for_backward(X, W, RSTD), i.e. its input in the
    training dtype and one fp32 rstd (no fp32 copy of X, unlike HF's RMSNorm). When the input is already held for
    another reason (the decoder layer's input under activation checkpointing: the checkpoint itself), X costs
    nothing more. The backward writes dX into dY (in_place=True by default, transformers/rms_norm.py LigerRMSNorm),
    so it allocates nothing per token."""
    return RSTD_BYTES + (0 if input_is_saved_elsewhere else B * n)


def swiglu_saved(inter: int, B: int) -> int:
    """ops/swiglu.py LigerSiLUMulFunction.forward: ctx.save_for_backward(a, b), gate and up; the product c is saved
    by down_proj (its input). silu(gate) is never stored: the backward recomputes it. -> 3 B I per token."""
    return 3 * B * inter


def swiglu_backward_extra(inter: int, B: int) -> int:
    """ops/swiglu.py swiglu_backward: da and db are written into a and b ("tl.store(a_ptr ...)"), so the backward's
    only new tensor is dc, the gradient of the product that down_proj's backward hands over: B I per token."""
    return B * inter


def flce_chunk_tokens(t: int, vocab: int, hidden: int) -> int:
    """ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward: inc_factor = cdiv(V, C * H),
    chunk_size = next_power_of_2(cdiv(BT, inc_factor)), at most BT."""
    inc = -(-vocab // (FLCE_CHUNK_MEM_CONST * hidden))
    per = -(-t // inc)
    chunk = 1 << max(0, (per - 1).bit_length())
    return max(1, min(chunk, t))


def flce_bytes(t: int, vocab: int, hidden: int, B: int) -> dict:
    """Bytes LigerFusedLinearCrossEntropyFunction holds at its peak (inside its forward, which also computes the
    gradients): grad_input = zeros_like(_input) (B h t), grad_weight = zeros_like(weight) (B V h; accum_dtype None,
    so the parameter dtype), loss_1d fp32 (4 t), the chunk's logits buffer (B V chunk; the cross-entropy kernel
    writes the logits' gradient into it in place), and target_mask (1 byte per token). The full logits never exist.
    After the forward, ctx.save_for_backward(grad_input, grad_weight) keeps the two gradients until the backward
    hands them on."""
    chunk = flce_chunk_tokens(t, vocab, hidden)
    parts = {"logits_chunk": B * vocab * chunk, "grad_input": B * hidden * t, "grad_weight": B * vocab * hidden,
             "loss_1d": 4 * t, "target_mask": t}
    return {"total": sum(parts.values()), "largest_block": max(parts.values()), "chunk_tokens": chunk, **parts}
