"""Activation-checkpoint offload: each checkpointed decoder layer's input hidden states wait for backward in host
memory (DeepSpeed's `CheckpointHiddenStatesOffload` engine: pinned buffer pool, side-stream copies, the newest
input kept on the device for the first backward).

Which tensor is marked. DeepSpeed marks `args[0]` of `GradientCheckpointingLayer.__call__`, but Transformers 5
checkpoints the layer's `forward` (modeling_layers.py: "We checkpoint `forward` instead of `__call__` so module
hooks ... stay outside the checkpoint"), and the tensor that reaches `forward` is not always the one `__call__` got:
ZeRO-3's forward pre-hook (`_post_backward_module_hook`, parameter_offload.py) hands the layer a detached copy
through its autograd Function. The checkpoint saved that copy, found no mark on it, and kept every layer's input on
the device ("0 offloaded, 0 kept in place" under ZeRO-3). So the mark is set here, on the layer instance's
`forward`, which `nn.Module.__call__` resolves after every pre-hook (whenever they were registered): it marks
exactly the tensor `torch.utils.checkpoint` saves, under any ZeRO stage. Transformers' own `offload=True`
(`save_on_cpu` around the checkpoint) was the other choice: it copies synchronously on the compute stream, pins a
fresh host tensor per layer and micro batch, and moves the last layer's input too, which backward needs at once.
"""
from __future__ import annotations

import types

import torch
from deepspeed.runtime.activation_checkpointing.offload_activations import CheckpointHiddenStatesOffload
from torch.autograd.graph import saved_tensors_hooks

from .offload_summary import format_line


class LayerInputOffload(CheckpointHiddenStatesOffload):
    """DeepSpeed's offload engine and pack/unpack hooks, with the marks set by `mark_checkpointed_inputs` (DeepSpeed's
    own `__call__` marker is not installed). Entered once per micro batch; `marked` and `consumed` count, for the
    micro batch, the layer inputs marked and the marks the checkpoint's pack hook took (each then offloaded, kept
    as the newest on the device, or kept in place where DeepSpeed does not offload: CPU tensors)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.active = False
        self.marked = self.consumed = 0

    def __enter__(self):
        if self.active:
            raise RuntimeError("LayerInputOffload is not re-entrant")
        self.reset()
        self.marked = self.consumed = 0
        self.active = True
        return saved_tensors_hooks.__enter__(self)

    def __exit__(self, *exc):
        self.active = False
        try:
            self._sync_and_clear()
        finally:
            saved_tensors_hooks.__exit__(self, *exc)
        return False

    def mark(self, tensor: torch.Tensor) -> None:
        super().mark(tensor)
        self.marked += 1

    def _pack_tensor(self, tensor: torch.Tensor):
        if self._allowed.get(id(tensor), 0) > 0:
            self.consumed += 1
        return super()._pack_tensor(tensor)

    def summary(self) -> str:
        """The end-of-run line (offload_summary.py), for the last micro batch."""
        s = self.stats
        return format_line(self.marked, self.consumed, s.offloaded_tensors, s.offloaded_bytes, s.kept_last_tensors,
                           s.skipped_marked_tensors)


def _marking_forward(offload: LayerInputOffload):
    def forward(self, *args, **kwargs):
        hidden = args[0] if args and isinstance(args[0], torch.Tensor) else None
        marked = hidden if (offload.active and self.training and torch.is_grad_enabled()
                            and self.gradient_checkpointing) else None
        if marked is not None:
            offload.mark(marked)
        try:
            return type(self).forward(self, *args, **kwargs)  # Transformers' checkpointing forward
        finally:
            if marked is not None:  # a mark the checkpoint did not take must not outlive the call (ids are reused)
                offload._consume_mark(marked)

    return forward


def mark_checkpointed_inputs(model: torch.nn.Module, offload: LayerInputOffload) -> int:
    """Mark each checkpointed layer's input at its `forward` (an instance attribute, so after all module hooks).
    Returns the number of layers."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    n = 0
    for module in model.modules():
        if isinstance(module, GradientCheckpointingLayer):
            if "forward" in module.__dict__:
                raise RuntimeError(f"checkpoint offload: {type(module).__name__} already has an instance forward")
            module.forward = types.MethodType(_marking_forward(offload), module)
            n += 1
    return n
