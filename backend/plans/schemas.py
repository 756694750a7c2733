"""Pydantic shapes of plan-v1 (../shared/spec/plan-v1.md). Types are checked here; the planner checks the rules."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from backend.core.text import NoControlChars


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # plan-v1 allows added fields


class ModelSpec(_Open):
    preset: str | None = Field(None, max_length=200, examples=["Qwen/Qwen3-4B"])
    config: dict[str, Any] | None = Field(None, description="A Hugging Face config.json")

    @model_validator(mode="after")
    def _one_of(self) -> "ModelSpec":
        if (self.preset is None) == (self.config is None):
            raise ValueError("give exactly one of model.preset or model.config")
        return self


class CustomGpu(_Open):
    name: Annotated[str, NoControlChars] = Field(max_length=100)
    memory_gib: float = Field(gt=0, le=10_000)
    hbm_tb_per_s: float = Field(gt=0)
    bf16_dense_tflops: float = Field(gt=0)
    nvlink_gb_per_s_per_direction: float = Field(gt=0)
    typical_internode_gb_per_s: float = Field(gt=0)


class Hardware(_Open):
    gpu: str | CustomGpu = Field("H100-80GB", examples=["H100-80GB"])
    gpus_per_node: int = Field(8, ge=1, le=64)
    num_nodes: int = Field(1, ge=1, le=4096)
    cpu_memory_gib_per_node: float | None = Field(None, gt=0, le=1_000_000)


class Parallel(_Open):
    sp_size: int = Field(1, ge=1, le=4096)
    dp_size: int = Field(1, ge=1, le=65536)


class Training(_Open):
    seq_len: int = Field(ge=1, le=1 << 30)
    micro_batch_size: int = Field(1, ge=1, le=4096)
    grad_accum: int = Field(1, ge=1, le=65536)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    zero_stage: Literal[0, 1, 2, 3] = 3
    offload_optimizer: bool = False
    offload_params: bool = False
    activation_checkpointing: bool = True
    checkpoint_offload: bool = False
    tiled_mlp: bool = False
    tiled_logits_loss: bool = False
    attn_implementation: Literal["flash_attention_2", "flash_attention_3", "sdpa"] = "flash_attention_2"


class PlanSpec(_Open):
    model: ModelSpec
    hardware: Hardware
    parallel: Parallel
    training: Training

    def as_dict(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


class PlanCreate(PlanSpec):
    name: Annotated[str, NoControlChars] = Field("", max_length=200)


class SweepRequest(BaseModel):
    plan: PlanSpec
    sp_sizes: list[int] | None = Field(None, max_length=16)
    seq_lens: list[int] | None = Field(None, max_length=64)


class PlanOut(BaseModel):
    id: int
    name: str
    created_at: datetime
    plan: dict
    estimate: dict
