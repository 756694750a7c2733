"""Liger kernels for the FakeTensor trace (plan.traced), as stand-ins.

Liger's kernels are Triton and run on CUDA only: under FakeTensorMode on a CPU they cannot run (there is no Triton
launch for a fake tensor), so the trace cannot execute liger-kernel itself. Each stand-in below is an autograd
Function that allocates exactly the tensors the Liger Function allocates and saves exactly what it saves (the
liger-kernel 0.8.5 lines are cited), computing nothing: under FakeTensorMode only sizes exist, so this measures
what the analytical Liger terms (plan.liger) claim, with the rest of the real Hugging Face model around them.
Liger's RoPE is not replaced: like HF's it saves only cos/sin (ops/rope.py LigerRopeFunction.forward:
ctx.save_for_backward(cos, sin)); it only avoids HF's temporaries, which the analytical model does not count.

These stand-ins are only meaningful under FakeTensorMode: their outputs hold no values.
"""
from __future__ import annotations

import contextlib
import types

from .liger import flce_chunk_tokens


def _functions():
    import torch

    class RMSNorm(torch.autograd.Function):
        """ops/rms_norm.py LigerRMSNormFunction: Y = empty((n_rows, n_cols)), RSTD = empty(n_rows, float32);
        ctx.save_for_backward(X, W, RSTD). Backward with in_place=True: dX = dY; _dW = empty((sm_count, n_cols),
        float32) summed to dW."""

        @staticmethod
        def forward(ctx, x, w):
            rows = x.numel() // x.shape[-1]
            y = torch.empty_like(x)
            rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
            ctx.save_for_backward(x, w, rstd)
            return y

        @staticmethod
        def backward(ctx, dy):
            _x, w, _rstd = ctx.saved_tensors
            dw = torch.empty((1, w.shape[0]), dtype=torch.float32, device=w.device).sum(0).to(w.dtype)
            return dy, dw

    class SiLUMul(torch.autograd.Function):
        """ops/swiglu.py LigerSiLUMulFunction: c = empty_like(a); ctx.save_for_backward(a, b); the backward writes
        da, db into a and b and returns them."""

        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, dc):
            a, b = ctx.saved_tensors
            return a, b

    class FusedLinearCrossEntropy(torch.autograd.Function):
        """ops/fused_linear_cross_entropy.py: grad_input = zeros_like(_input), grad_weight = zeros_like(weight),
        loss_1d = zeros(BT, float32), target_mask, one logits buffer of chunk_size x V (use_mm_out), per chunk the
        logits, their gradient in place, grad_input's rows and grad_weight's accumulation;
        ctx.save_for_backward(grad_input, grad_weight); the backward returns them (grad_output is 1.0)."""

        @staticmethod
        def forward(ctx, x, weight, target):
            bt, h = x.shape
            v = weight.shape[0]
            chunk = flce_chunk_tokens(bt, v, h)
            grad_input = torch.zeros_like(x)
            grad_weight = torch.zeros_like(weight)
            loss_1d = torch.zeros(bt, dtype=torch.float32, device=x.device)
            mask = target != -100
            logits = torch.empty((chunk, v), dtype=x.dtype, device=x.device)
            for start in range(0, bt, chunk):
                end = min(start + chunk, bt)
                rows = logits[: end - start]
                torch.mm(x[start:end], weight.t(), out=rows)
                torch.mm(rows, weight, out=grad_input[start:end])
                grad_weight.addmm_(rows.t(), x[start:end])
            del logits, mask
            ctx.save_for_backward(grad_input, grad_weight)
            return loss_1d.sum()

        @staticmethod
        def backward(ctx, grad_output):
            grad_input, grad_weight = ctx.saved_tensors
            return grad_input, grad_weight, None

    return RMSNorm, SiLUMul, FusedLinearCrossEntropy


def liger_swiglu():
    """The SwiGLU stand-in (for the trace's TiledMLP shards)."""
    return _functions()[1]


@contextlib.contextmanager
def liger_standins(model, fused_loss: bool = True):
    """Patch a built HF causal LM as Transformers' use_liger_kernel does (every RMSNorm, the SwiGLU MLPs, and with
    `fused_loss` the CausalLM forward's lm_head + loss: training_fields.liger_fused_loss), with the stand-ins
    above."""
    import torch

    rms, silu_mul, flce = _functions()
    patched: list[tuple[object, str, object]] = []

    def patch(obj, name, value):
        patched.append((obj, name, obj.__dict__.get(name)))
        setattr(obj, name, value)

    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm"):
            patch(module, "forward", types.MethodType(lambda self, x: rms.apply(x, self.weight), module))
        elif kind.endswith("MLP") and hasattr(module, "gate_proj"):
            patch(module, "forward", types.MethodType(
                lambda self, x: self.down_proj(silu_mul.apply(self.gate_proj(x), self.up_proj(x))), module))

    def lce_forward(self, input_ids=None, labels=None, position_ids=None, **kwargs):
        hidden = self.model(input_ids=input_ids, position_ids=position_ids, **kwargs).last_hidden_state
        h = hidden.shape[-1]
        # liger transformers/model/loss_utils.py LigerForCausalLMLoss: pad and shift the labels, flatten
        shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
        loss = flce.apply(hidden.view(-1, h), self.lm_head.weight, shift.view(-1))
        return types.SimpleNamespace(loss=loss)

    if fused_loss:
        patch(model, "forward", types.MethodType(lce_forward, model))
    try:
        yield model
    finally:
        for obj, name, old in reversed(patched):
            if old is None:
                delattr(obj, name)
            else:
                setattr(obj, name, old)
