"""The training section's fields as explicit, typed properties, for the views of a plan that read them by name
(`Spec` in plan/validation.py, the trainer's `RunSpec`): `spec.zero_stage` is `plan.training.zero_stage`. A training
field added to plan/model.py gets its line here; tests/unit/test_training_fields.py checks that none is missing."""
from __future__ import annotations

from typing import Literal

from .model import AttnImplementation, Dtype, Training


class TrainingFields:
    """Read-only access to `training_section`'s fields."""

    @property
    def training_section(self) -> Training:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        return self.training_section.seq_len

    @property
    def micro_batch_size(self) -> int:
        return self.training_section.micro_batch_size

    @property
    def grad_accum(self) -> int:
        return self.training_section.grad_accum

    @property
    def dtype(self) -> Dtype:
        return self.training_section.dtype

    @property
    def zero_stage(self) -> int:
        return self.training_section.zero_stage

    @property
    def offload_optimizer(self) -> bool:
        return self.training_section.offload_optimizer

    @property
    def offload_params(self) -> bool:
        return self.training_section.offload_params

    @property
    def activation_checkpointing(self) -> bool:
        return self.training_section.activation_checkpointing

    @property
    def checkpoint_offload(self) -> bool:
        return self.training_section.checkpoint_offload

    @property
    def tiled_mlp(self) -> bool:
        return self.training_section.tiled_mlp

    @property
    def tiled_logits_loss(self) -> bool:
        return self.training_section.tiled_logits_loss

    @property
    def upcast_logits(self) -> bool:
        return self.training_section.upcast_logits

    @property
    def attn_implementation(self) -> AttnImplementation:
        return self.training_section.attn_implementation

    @property
    def max_grad_norm(self) -> float:
        return self.training_section.max_grad_norm

    @property
    def liger_kernel(self) -> bool:
        return self.training_section.liger_kernel

    @property
    def seq_parallel_communication_data_type(self) -> Literal["fp32", "bf16"]:
        return self.training_section.seq_parallel_communication_data_type

    @property
    def document_len(self) -> int | None:
        return self.training_section.document_len

    @property
    def expandable_segments(self) -> bool:
        return self.training_section.expandable_segments

    @property
    def bf16_optimizer_states(self) -> bool:
        return self.training_section.bf16_optimizer_states
