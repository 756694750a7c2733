"""The shapes the planner answers (plan-v1 Estimate, max-context search, sweep, exports, catalog), as pydantic
models. The estimators build plain dicts (fast); the API declares these as its response models, so the OpenAPI
schema, and the dashboard's generated types, say exactly what comes back."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .verdict import verdict_fields

Verdict = Literal["fits", "tight", "does_not_fit"]
BAND = ("from the validation corpus's residuals in this estimate's regime, leave-one-source-out "
        "(plan/data/uncertainty_bands.csv, bench/planner_bands.py)")


class FieldErrorOut(BaseModel):
    field: str
    message: str


class MemoryEstimate(BaseModel):
    peak_allocated_gib: float
    device_total_gib: float
    gpu_capacity_gib: float
    fits: bool = Field(description='verdict == "fits"')
    verdict: Verdict = Field(description='"fits": the range\'s high end fits; "tight": only its low end does; '
                                         '"does_not_fit": not even the low end')
    verdict_label: str = Field(description='The badge every page shows: "fits", "may not fit" or "does not fit" '
                                           '(host memory that does not fit reads "does not fit"; plan/verdict.py)')
    verdict_text: str = Field(description='The verdict as one sentence, the same on every page and in `ulab plan '
                                          '--text`: "fits with 9-17 GiB to spare", "may not fit: 74-86 GiB of 80"')
    device_total_gib_range: list[float] = Field(description="[low, high] of device_total_gib, " + BAND)
    peak_allocated_gib_range: list[float] = Field(description="[low, high] of peak_allocated_gib, " + BAND)
    reserved_gib_range: list[float] | None = Field(None, description="[low, high] of reserved_gib, " + BAND)
    headroom_gib_range: list[float] = Field(description="[low, high] of capacity - device total (negative: over)")
    headroom_pct_range: list[float] = Field(description="headroom_gib_range as percent of the capacity")
    breakdown_gib: dict[str, float]
    peak_phase: str = ""
    reserved_gib: float | None = Field(None, description="The caching allocator's reserved peak "
                                                         "(torch.cuda.max_memory_reserved)")
    allocator_stranded_gib: float | None = Field(None, description="Reserved but unusable at the peak: what the "
                                                                   "largest transient block leaves when a smaller "
                                                                   "one is carved from it")
    context_and_nccl_gib: float | None = Field(None, description="CUDA context and NCCL buffers (outside the "
                                                                 "allocator)")
    cpu_gib_per_node: float
    cpu_capacity_gib_per_node: float | None = None
    cpu_fits: bool
    cpu_breakdown_gib_per_node: dict[str, float] = {}

    @model_validator(mode="before")
    @classmethod
    def _stated_verdict(cls, data: Any) -> Any:
        """An estimate stored before the verdict was stated in words gets its words from the same function."""
        if isinstance(data, dict) and "verdict_text" not in data and data.get("device_total_gib_range"):
            lo, hi = data["device_total_gib_range"]
            cpu = data.get("cpu_gib_per_node", 0.0)
            return {**data, **verdict_fields(lo, hi, data["gpu_capacity_gib"], cpu,
                                             data.get("cpu_capacity_gib_per_node") or cpu)}
        return data


class ThroughputEstimate(BaseModel):
    step_time_s: float
    tokens_per_s: float
    step_time_s_range: list[float] = Field(description="[low, high] of step_time_s, " + BAND)
    tokens_per_s_range: list[float] = Field(description="[low, high] of tokens_per_s, " + BAND)
    # absent from estimates stored before they were stated
    sequences_per_step: int | None = Field(None, description="The global batch: sequences per optimizer step "
                                                             "(micro_batch_size x grad_accum x dp_size)")
    tokens_per_step: int | None = Field(None, description="Tokens per optimizer step (sequences_per_step x seq_len)")
    time_per_billion_tokens_s: float | None = Field(None, description="Seconds to train on 10^9 tokens at "
                                                                      "tokens_per_s")
    time_per_billion_tokens_s_range: list[float] | None = Field(None, description="[low, high] of "
                                                                "time_per_billion_tokens_s, " + BAND)
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    mfu: float
    time_breakdown_s: dict[str, float] = {}


class ModelSummary(BaseModel):
    name: str
    params: int
    local_tokens_per_rank: int


class CostEstimate(BaseModel):
    """What the run will cost: its training steps only (loading, checkpoint saves and evaluations come on top)."""
    source: Literal["train_tokens", "run.stages"] = Field(description="The budget read: train_tokens at the plan's "
                                                                      "seq_len, or the run section's stages")
    train_tokens: int = Field(description="Tokens the steps train (the budget rounded up to whole steps)")
    steps: int = Field(description="Optimizer steps: the budget over the tokens of one step, rounded up")
    gpus: int
    wall_time_s: float
    wall_time_s_range: list[float] = Field(description="[low, high] of wall_time_s: the step time's range")
    gpu_hours: float = Field(description="wall_time_s x gpus / 3600")
    gpu_hours_range: list[float]
    summary: str = Field(description='One line, e.g. "about 41 h (35-52 h), 1,312 GPU-hours"')


class Estimate(BaseModel):
    valid: bool
    errors: list[FieldErrorOut]
    warnings: list[FieldErrorOut]
    memory: MemoryEstimate | None
    throughput: ThroughputEstimate | None
    model: ModelSummary | None = None
    cost: CostEstimate | None = Field(None, description="With a token budget (train_tokens) or a run section: the "
                                                        "wall time and GPU-hours")


class MaxSeq(BaseModel):
    max_seq_len: int | None = Field(description="= safe: the longest seq_len where memory.fits (the range's high "
                                                "end fits) and cpu_fits hold")
    likely: int | None = Field(None, description="Longest seq_len whose point estimate fits")
    safe: int | None = Field(None, description="Longest seq_len whose memory range's high end fits (verdict fits)")
    optimistic: int | None = Field(None, description="Longest seq_len whose memory range's low end fits")
    estimate: Estimate


class SweepSeries(BaseModel):
    sp_size: int
    dp_size: int | None = None
    valid: bool
    errors: list[FieldErrorOut]
    gpus: int | None = None
    max_seq_len: int | None = Field(description="Longest seq_len whose point estimate fits (likely)")
    safe_max_seq_len: int | None = Field(None, description="Longest seq_len whose memory range's high end fits")
    peak_allocated_gib: list[float | None]
    device_total_gib: list[float | None]
    tokens_per_s: list[float | None]
    fits: list[bool | None] = Field(description='memory.verdict == "fits" and cpu_fits at each seq_len')


class Sweep(BaseModel):
    valid: bool
    errors: list[FieldErrorOut]
    seq_lens: list[int]
    series: list[SweepSeries]
    gpu_capacity_gib: float | None


class Exports(BaseModel):
    valid: bool
    errors: list[FieldErrorOut]
    accelerate_yaml: str | None = None
    deepspeed_json: str | None = Field(None, description="DeepSpeed config with every value resolved")
    deepspeed_json_hf_trainer: str | None = Field(None, description='DeepSpeed config for the Transformers Trainer '
                                                                    '("auto" values it fills in)')
    launch_command: str | None = None
    accelerate_yaml_per_node: list[str] = []
    launch_commands_per_node: list[str] = []
    plan_json: str | None = None
    training_args_json: str | None = Field(None, description="TrainingArguments, ParallelismConfig and the ALST "
                                                             "switches, for a user's own script")
    sbatch_script: str | None = Field(None, description="A Slurm batch script that runs plan.json on the plan's "
                                                        "nodes (sbatch it beside plan.json)")


class CatalogModel(BaseModel):
    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int | None
    model_type: str
    qk_norm: bool
    qkv_bias: bool
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    shared_expert_size: int = 0
    shared_expert_gate: bool = False
    dense_layers: int = 0
    dense_intermediate_size: int = 0
    params: int


class CatalogGpu(BaseModel):
    name: str
    memory_gib: float
    hbm_tb_per_s: float
    bf16_dense_tflops: float
    nvlink_gb_per_s_per_direction: float
    typical_internode_gb_per_s: float


class Catalog(BaseModel):
    models: list[CatalogModel]
    gpus: list[CatalogGpu]


class Recommendation(BaseModel):
    plan: dict[str, Any] = Field(description="The recommended plan, every default filled in")
    estimate: Estimate
    reasons: list[str] = Field(description="One line per choice that matters")
    kernels: list[str] = Field(description="The kernels the plan needs on its workers: its attention implementation, "
                                           "and liger_kernel when Liger is on")
    missing_kernels: list[str] = Field(description="Those of `kernels` no live worker of the plan's queue has (empty "
                                                   "when the queue's kernels are not known): such an option sorts "
                                                   "after every option that needs none")
    unavailable: str | None = Field(None, description="Why the option cannot run on the queue now, when it cannot")


class RejectedPlan(BaseModel):
    plan: dict[str, Any]
    why: str


class Recommend(BaseModel):
    """`ulab plan --recommend [--longest]`: fitting configurations, best first, and the nearest rejected ones."""

    recommendations: list[Recommendation]
    rejected: list[RejectedPlan]
    errors: list[FieldErrorOut] = []
    queue_kernels: list[str] | None = Field(None, description="The attention kernels the live workers of the plan's "
                                            "queue report (null: none is up, nothing is known)")
    global_batch: int | None = Field(None, description="The sequences per optimizer step every option holds (by its "
                                                       "grad_accum); null: the search varied the global batch")


class FixChange(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    field: str
    from_: Any = Field(alias="from")
    to: Any
    cost_pct: float | None = Field(None, description="Step time change of this change alone, percent")


class Fix(BaseModel):
    """`ulab plan --fix`: the fewest changes that make a plan fit, cheapest speed cost first."""

    changes: list[FixChange]
    plan: dict[str, Any] | None
    estimate: Estimate
    cost: str
    fits: bool
    queue_kernels: list[str] | None = Field(None, description="The attention kernels the plan's queue can run (its "
                                            "live workers'; null: not known): a plan asking another is moved to the "
                                            "best of these, and Liger is proposed only where a worker has it")


class SpMethodOption(BaseModel):
    method: Literal["ulysses", "ring", "hybrid"]
    degree: int
    ulysses_degree: int
    ring_degree: int
    valid: bool
    why_not: str | None = None
    device_total_gib: float | None = None
    device_total_gib_range: list[float] | None = None
    verdict: Verdict | None = None
    verdict_label: str | None = Field(None, description='"fits", "may not fit" or "does not fit" (plan/verdict.py)')
    fits: bool | None = None
    comm_gb_per_step: float | None = None
    all_to_all_s: float | None = None
    exposed_ring_s: float | None = None
    step_time_s: float | None = None
    step_time_s_range: list[float] | None = None
    tokens_per_s: float | None = None
    tokens_per_s_range: list[float] | None = None


class SpMethods(BaseModel):
    """Ulysses vs ring attention vs a Ulysses x ring hybrid (an estimate: Ulysses Lab trains with Ulysses)."""

    label: str
    valid: bool
    errors: list[FieldErrorOut] = []
    options: list[SpMethodOption]
    choice: str | None
    why: str
