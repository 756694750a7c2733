"""HTTP shapes of plans. The plan itself is the plan model (plan/model.py): the API adds only its own envelope."""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from backend.core.text import NoControlChars
from plan import Plan
from plan.cost import TrainTokens
from plan.results import Estimate


class PlanCreate(Plan):
    """A plan to store, with an optional name."""

    name: Annotated[str, NoControlChars] = Field("", max_length=200)

    def plan_data(self) -> dict:
        return self.model_dump(mode="json", exclude={"name"})


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: Plan
    sp_sizes: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(None, max_length=16)
    seq_lens: list[Annotated[int, Field(ge=1, le=1 << 30)]] | None = Field(None, max_length=64)


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plan: Plan = Field(description="Model, hardware and training.seq_len; other training/parallel fields it sets are "
                                   "locked")
    longest: bool = Field(False, description="Search for the longest seq_len instead")
    train_tokens: TrainTokens | None = Field(None, description="Rank by the wall time to train this many tokens "
                                                               "(each recommendation's estimate answers `cost`)")
    vary_global_batch: bool = Field(False, description="Let the global batch follow dp (grad_accum stays the plan's) "
                                                       "instead of holding it by grad_accum")
    global_batch: int | None = Field(None, ge=1, le=1 << 24, description="Sequences per optimizer step to hold "
                                     "(default: the plan's micro_batch_size x grad_accum x dp_size)")


class PlanDefaults(BaseModel):
    """What a new planner form starts from: an example plan with every default filled in, and each section's
    defaults (for fields a loaded plan leaves out)."""

    plan: dict[str, Any]
    defaults: dict[str, dict[str, Any]]
    choices: dict[str, list[Any]] = Field(description="Allowed values of closed-choice fields, by dotted name")


class PlanOut(BaseModel):
    id: int
    name: str
    created_at: datetime
    plan: dict[str, Any]
    estimate: Estimate
    probe: dict[str, Any] | None = Field(None, description="The latest probe of the plan (POST "
                                                           "/api/plans/{id}/probe): measured, extrapolated, predicted")


class ProbeRequest(BaseModel):
    """What a probe of a stored plan runs: the layer counts (each at most the model's) and the steps per depth."""

    model_config = ConfigDict(extra="forbid")
    depths: list[Annotated[int, Field(ge=1, le=1024)]] | None = Field(
        None, min_length=1, max_length=8, description="Layer counts to probe; absent: 1, 2 and 4 (those the model has)")
    steps: int = Field(4, ge=2, le=100, description="Steps per depth; the first is dropped")


class PlanImport(BaseModel):
    """A setup to import, as the user pastes it: each file's text (parsed here, so a broken line is named)."""

    model_config = ConfigDict(extra="forbid")
    ds_config: str | None = Field(None, max_length=1 << 20, description="ds_config.json, as text")
    launch: str | None = Field(None, max_length=1 << 16, description='The launch line ("deepspeed ...", "torchrun '
                                                                     '...", "accelerate launch ...")')
    accelerate_config: str | None = Field(None, max_length=1 << 20, description="An Accelerate config YAML")
    training_args: str | None = Field(None, max_length=1 << 20, description="TrainingArguments as JSON")
    gpu: str | None = Field(None, max_length=100, description="The GPU the job runs on (default H100-80GB)")
    gpus_per_node: int | None = Field(None, ge=1, le=1024, description="GPUs per node (default 8)")


class FieldNote(BaseModel):
    field: str
    message: str


class PlanImported(BaseModel):
    """The plan a setup describes (estimated), what none of its libraries reads (`warnings`), what cannot hold
    (`errors`, each naming both sides) and what it leaves to "auto" or a default (`defaults`)."""

    plan: dict[str, Any]
    warnings: list[FieldNote]
    errors: list[FieldNote]
    defaults: list[FieldNote]
    estimate: Estimate
