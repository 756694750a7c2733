"""The plan-v1 model (docs/plan-v1.md): every field, its default and its allowed values, written once.

A plan travels from the browser form through `POST /api/plans`, the planner, the stored run and `ulab train` to
the GPUs. Everything reads it through these classes, so a default or an allowed value can only mean one thing.

- Unknown keys are refused (`extra="forbid"`); `plan.errors` names them with the closest known key as a hint.
- Types are strict: `"3"` is not a ZeRO stage and `1` is not `true`.
- Rules that tie fields together (world size, divisibility by sp_size, ...) need the model's architecture and
  live in `plan.rules`; `plan.validate` runs both and answers every broken rule at once.

To add a field: declare it here with its default and bounds (and a docstring line); the API, the OpenAPI schema,
the dashboard's generated types, `ulab plan --effective` and the trainer's dry run pick it up from here.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

# Attention kernels a plan may name. Ulysses (sp_size > 1) refuses "eager" (plan.rules): DeepSpeed's
# UlyssesSPAttentionHF needs a causal kernel that takes no mask.
AttnImplementation = Literal["flash_attention_2", "flash_attention_3", "sdpa", "flex_attention", "eager"]
Dtype = Literal["bf16", "fp16", "fp32"]
LrScheduler = Literal["constant", "linear", "cosine"]
Tracker = Literal["mlflow", "wandb", "tensorboard"]
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2, "fp32": 4}


class Section(BaseModel):
    """A plan section: unknown keys are errors, types are strict, assignment re-validates nothing."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ModelSection(Section):
    """Exactly one of `preset` (a catalog name) or `config` (a Hugging Face config.json)."""

    preset: str | None = Field(None, max_length=200, examples=["Qwen/Qwen3-4B"])
    config: dict[str, Any] | None = Field(None, description="A Hugging Face config.json (any architecture the "
                                                            "planner can read: hidden_size, num_hidden_layers, ...)")


class CustomGpu(Section):
    """A GPU that is not in the catalog: the columns of the catalog's gpus.csv. The bounds reach far past any
    accelerator on both sides, so every estimate stays a finite number."""

    name: str = Field("custom", max_length=100)
    memory_gib: float = Field(ge=0.1, le=100_000)
    hbm_tb_per_s: float = Field(ge=0.001, le=10_000)
    bf16_dense_tflops: float = Field(ge=0.001, le=1_000_000)
    nvlink_gb_per_s_per_direction: float = Field(ge=0.001, le=1_000_000)
    typical_internode_gb_per_s: float = Field(ge=0.001, le=1_000_000)


def _gpu_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "gpu-name"
    if isinstance(value, dict | CustomGpu):
        return "gpu-object"
    return None


# Tags of tagged unions appear in pydantic's error locations; plan.errors drops them from field names.
UNION_TAGS = frozenset({"gpu-name", "gpu-object", "train", "passkey"})  # TAGGED_MODELS maps them to models
GpuChoice = Annotated[
    Annotated[str, Tag("gpu-name")] | Annotated[CustomGpu, Tag("gpu-object")],
    Discriminator(_gpu_kind, custom_error_type="gpu_type",
                  custom_error_message="must be a GPU name from the catalog or an object with the columns "
                                       "name, memory_gib, hbm_tb_per_s, bf16_dense_tflops, "
                                       "nvlink_gb_per_s_per_direction, typical_internode_gb_per_s"),
]


class Hardware(Section):
    gpu: GpuChoice = Field(description="A catalog GPU name (GET /api/catalog) or a custom GPU object",
                           examples=["H100-80GB"])
    gpus_per_node: int = Field(1, ge=1, le=1024)
    num_nodes: int = Field(1, ge=1, le=4096)
    cpu_memory_gib_per_node: float = Field(1024.0, gt=0, le=1_000_000,
                                           description="Host memory per node, for offloaded states and checkpoints")
    cpu_cores_per_node: int | None = Field(None, ge=1, le=1_000_000,
                                           description="CPU cores per node, shared by its ranks for the offloaded "
                                                       "optimizer step; absent: one core per rank (torchrun's "
                                                       "OMP_NUM_THREADS=1)")


class Parallel(Section):
    """The world is sp_size x dp_size ranks; it must equal gpus_per_node x num_nodes."""

    sp_size: int = Field(1, ge=1, le=4096, description="Ulysses sequence-parallel degree")
    dp_size: int = Field(1, ge=1, le=65536, description="Data-parallel replicas of each SP group")


class Training(Section):
    """Defaults are what a user of ALST expects on a GPU: ZeRO-3, activation checkpointing, flash attention 2.
    A CPU run (no CUDA) trains with sdpa instead and says so in its log."""

    seq_len: int = Field(ge=1, le=1 << 30, description="Tokens per sequence (a multiple of sp_size)")
    micro_batch_size: int = Field(1, ge=1, le=4096)
    grad_accum: int = Field(1, ge=1, le=65536)
    dtype: Dtype = "bf16"
    zero_stage: int = Field(3, ge=0, le=3, description="DeepSpeed ZeRO stage 0-3")
    offload_optimizer: bool = False
    offload_params: bool = False
    activation_checkpointing: bool = True
    checkpoint_offload: bool = False
    tiled_mlp: bool = False
    tiled_logits_loss: bool = False
    attn_implementation: AttnImplementation = "flash_attention_2"
    max_grad_norm: float = Field(1.0, ge=0, le=1e6, description="Gradient clipping (0: none)")
    liger_kernel: bool = Field(False, description="Liger kernels (fused SwiGLU, RMSNorm, RoPE, fused linear "
                                                  "cross-entropy) as Transformers' use_liger_kernel; CUDA only")
    seq_parallel_communication_data_type: Literal["fp32", "bf16"] = Field(
        "fp32", description="DeepSpeed's dtype for the gradient reduction of sequence-parallel runs (its key and "
                            "default)")
    document_len: int | None = Field(None, ge=1, le=1 << 30, description="Mean tokens per packed document; absent: "
                                                                         "every sequence is one document")
    expandable_segments: bool = Field(False, description="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    bf16_optimizer_states: bool = Field(False, description="Master weights, gradients and Adam moments in bf16 "
                                                           "(DeepSpeed's bf16.bf16_master_weights_and_grads and "
                                                           "bf16_optimizer_states; FSDP2 recipes with a bf16 model): "
                                                           "6 bytes of optimizer state per parameter instead of 12")
    upcast_logits: bool = Field(True, description="Cross-entropy on an fp32 copy of the logits (Transformers' "
                                                  "ForCausalLMLoss; this trainer's default). false: on the model's "
                                                  "dtype, as ms-swift's sequence-parallel loss does: in bf16, 6 "
                                                  "bytes per vocabulary entry per token at the loss's peak, not 12")


class Stage(Section):
    """One stage of progressive context extension; learning-rate fields default to the run's."""

    kind: Literal["train"] = "train"
    seq_len: int = Field(ge=1, le=1 << 30)
    steps: int = Field(ge=1, le=10_000_000)
    learning_rate: float | None = Field(None, gt=0, le=10)
    warmup_steps: int | None = Field(None, ge=0, le=10_000_000)
    lr_scheduler: LrScheduler | None = None


PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
PASSKEY_MIN_LEN = 128  # the key's sentence, the question and the answer take about 80 bytes (the byte tokenizer)


class PasskeyStage(Section):
    """A passkey (needle-in-a-haystack) test of the model the training stage before it ends with: a five-digit key
    hidden at each depth of a filler text of each length, then asked for; the score is the share of the key's
    tokens the model predicts (argmax, teacher-forced) at the answer. Trains nothing (worker/trainer/evaluate.py)."""

    kind: Literal["passkey"]
    seq_len: int = Field(ge=PASSKEY_MIN_LEN, le=1 << 30, description="The longest context tested")
    lengths: list[Annotated[int, Field(ge=PASSKEY_MIN_LEN, le=1 << 30)]] | None = Field(
        None, min_length=1, max_length=16, description="Context lengths tested; absent: seq_len/8, /4, /2 and seq_len "
                                                       "(each a multiple of sp_size)")
    depths: list[Annotated[float, Field(ge=0, le=1)]] = Field(
        list(PASSKEY_DEPTHS), min_length=1, max_length=21, description="Where the key sits in the filler: 0 at the "
                                                                       "start, 1 right before the question")
    trials: int = Field(1, ge=1, le=100, description="Keys tried per cell (the score is their mean)")

    def test_lengths(self, sp_size: int) -> list[int]:
        """The context lengths tested: `lengths`, or seq_len/8, /4, /2, seq_len rounded down to multiples of sp."""
        raw = self.lengths or [self.seq_len // 8, self.seq_len // 4, self.seq_len // 2, self.seq_len]
        return sorted({n - n % sp_size for n in raw if n - n % sp_size >= PASSKEY_MIN_LEN})


def _stage_kind(value: Any) -> str | None:
    kind = value.get("kind", "train") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in ("train", "passkey") else None


StageEntry = Annotated[
    Annotated[Stage, Tag("train")] | Annotated[PasskeyStage, Tag("passkey")],
    Discriminator(_stage_kind, custom_error_type="stage_kind",
                  custom_error_message='kind must be "train" (the default) or "passkey"'),
]


# The model each tag of the plan's tagged unions reads a value as (plan.errors names that model's fields only)
TAGGED_MODELS: dict[str, type[BaseModel]] = {"gpu-object": CustomGpu, "train": Stage, "passkey": PasskeyStage}


class Data(Section):
    path: str = Field(min_length=1, max_length=4096, examples=["examples/data/sample.txt"],
                      description="A text, JSONL or Parquet file, or a datasets directory saved with save_to_disk")
    text_field: str = Field("text", min_length=1, max_length=200, description="JSONL key / column with the text")
    split: Literal["blank_line", "line"] = Field("blank_line", description="How a text file separates documents")


class ProbeGate(Section):
    """The smoke test of a run (backend/alerts/service.py): its first `steps` steps are checked at metric ingest,
    and a breach stops the run with a checkpoint and the reason; otherwise it trains on in the same attempt."""

    steps: int = Field(10, ge=1, le=100_000, description="Steps checked from the run's start")
    max_memory_fraction: float = Field(0.9, gt=0, le=1, description="Stop when a rank's peak memory passes this "
                                                                     "fraction of the GPU's")
    min_tokens_per_s_fraction: float = Field(0.5, ge=0, le=10, description="Stop when tokens/s (median over the "
                                                                          "checked steps after the first) is below "
                                                                          "this fraction of the planner's (0: off)")
    require_finite_loss: bool = Field(True, description="Stop when a checked step's loss is NaN/Inf")


# The files a Transformers tokenizer loads from (checked at approval, backend/inputs/tokenizer_source.py, and by the
# trainer): a fast tokenizer (tokenizer.json), SentencePiece (tokenizer.model, spiece.model), byte-level BPE
# (vocab.json), WordPiece (vocab.txt), tiktoken (tokenizer.tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "tokenizer.tiktoken")


class RunSection(Section):
    """What the trainer reads besides the plan (trainer-v1). `model_path` null builds `model.config` with random
    weights (tests, CPU). Without `stages`, the run is one stage of `steps` at `training.seq_len`."""

    steps: int = Field(20, ge=1, le=10_000_000)
    learning_rate: float = Field(1e-4, gt=0, le=10)
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    lr_scheduler: LrScheduler = "constant"
    weight_decay: float = Field(0.0, ge=0, le=10)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    data: Data
    model_path: str | None = Field(None, min_length=1, max_length=4096,
                                   description="A local checkpoint directory or a Hugging Face hub id")
    tokenizer: str | None = Field(None, min_length=1, max_length=4096,
                                  description="A tokenizer directory or hub id; absent: the checkpoint's own "
                                              "(run.model_path), or the built-in byte tokenizer for random weights")
    checkpoint_every: int = Field(100, ge=0, le=10_000_000, description="Steps between checkpoints (0: never)")
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    stages: list[StageEntry] | None = Field(None, min_length=1, max_length=64,
                                            description="Training stages (progressive context extension), each "
                                                        "optionally followed by passkey tests of its model")
    # Loss by token position (worker/trainer/evaluate.py): the last eval_rows rows of each stage's packed data are
    # held back from training and scored in log2-spaced buckets of the position inside the document.
    eval_rows: int = Field(0, ge=0, le=10_000, description="Rows of each stage's data held back for the "
                                                           "loss-by-position evaluation (0: none)")
    eval_every: int = Field(0, ge=0, le=10_000_000, description="Steps between loss-by-position evaluations "
                                                                "(0: at the end of each stage only)")
    track_memory: bool = Field(True, description="Measure each rank's peak memory per step")
    memory_every: int = Field(10, ge=1, le=10_000_000, description="CPU ranks (whose meter sees every op): measure "
                                                                   "memory on each stage's first 2 steps and every "
                                                                   "N-th step; the records between carry the last "
                                                                   "measured figures (`memory_step`). CUDA: every step")
    # Alerts at metric ingest (backend/alerts/service.py). 10x: cross-entropy starts near ln(vocab) and falls, so a
    # healthy run stays within a few times its running minimum; a diverging one grows by orders of magnitude.
    divergence_factor: float = Field(10.0, gt=1, le=1e6, description="Alert when the loss exceeds this many times "
                                                                    "the attempt's lowest loss so far (from the "
                                                                    "attempt's 3rd step)")
    stop_on_nan: bool = Field(True, description="Stop the run (with a checkpoint) when loss or grad norm is NaN/Inf")
    stop_on_divergence: bool = Field(True, description="Stop the run (with a checkpoint) when the loss diverged")
    # A spike of 10x the recent median is far outside the step-to-step spread of a healthy run's grad norm (which
    # clipping at max_grad_norm hides from the update, not from the measurement).
    grad_norm_factor: float = Field(10.0, gt=1, le=1e6, description="Alert when the grad norm exceeds this many "
                                                                    "times its median over the last 100 steps")
    stop_on_grad_norm: bool = Field(False, description="Stop the run (with a checkpoint) when the grad norm exploded")
    throughput_floor: float = Field(0.5, gt=0, lt=1, description="Alert when tokens/s stays below this fraction of "
                                                                 "the run's median for 5 steps in a row")
    stop_on_throughput: bool = Field(False, description="Stop the run (with a checkpoint) when tokens/s dropped")
    # 30 min: a step of a large model at 1M tokens takes minutes, and the first step waits for the model to load.
    stall_after_s: float = Field(1800.0, gt=0, le=7 * 86_400, description="Alert when no step arrives for this many "
                                                                          "seconds while the run is running")
    stop_on_stall: bool = Field(False, description="Stop the run (with a checkpoint) when no step arrives")
    # Mirrors of the run in the user's own tracker (worker/trackers.py forwards what the API stored).
    report_to: list[Tracker] = Field([], max_length=3, description="Trackers the worker mirrors "
                                     "the run to: its metrics, the plan as params, the estimate, alerts as tags")
    tracker_uri: str | None = Field(None, min_length=1, max_length=2048, description="MLflow tracking URI "
                                    "(absent: ULAB_MLFLOW_TRACKING_URI)")
    tracker_project: str | None = Field(None, min_length=1, max_length=200, description="MLflow experiment and W&B "
                                        "project (absent: ULAB_TRACKER_PROJECT)")
    probe: ProbeGate | None = Field(None, description="The smoke-test gate on the first steps (absent: none)")
    stop_grace_s: float | None = Field(None, gt=0, le=86_400,
                                       description="Seconds a stopped run (SIGTERM) has to save its checkpoint before "
                                                   "SIGKILL; absent: what a ZeRO-3 save of the model needs "
                                                   "(plan.launch.stop_grace_s)")


class StagePlan(BaseModel):
    """A stage as the trainer runs it: every learning-rate field resolved."""

    model_config = ConfigDict(frozen=True)
    seq_len: int
    steps: int
    learning_rate: float
    warmup_steps: int
    lr_scheduler: LrScheduler


class Plan(Section):
    """plan-v1, with the trainer's optional `run` section (trainer-v1)."""

    model: ModelSection
    hardware: Hardware
    parallel: Parallel = Field(default_factory=Parallel)
    training: Training
    run: RunSection | None = None

    @property
    def world_size(self) -> int:
        return self.parallel.sp_size * self.parallel.dp_size

    def stages(self) -> list[StagePlan]:
        """The stages the trainer runs: `run.stages`, or one stage of `run.steps` at `training.seq_len`."""
        run = self.run
        if run is None:
            return []
        raw = [s for s in run.stages or [] if isinstance(s, Stage)] or [Stage(seq_len=self.training.seq_len,
                                                                               steps=run.steps)]
        return [StagePlan(seq_len=s.seq_len, steps=s.steps,
                          learning_rate=run.learning_rate if s.learning_rate is None else s.learning_rate,
                          warmup_steps=run.warmup_steps if s.warmup_steps is None else s.warmup_steps,
                          lr_scheduler=s.lr_scheduler or run.lr_scheduler) for s in raw]

    def passkey_tests(self) -> list[tuple[int, PasskeyStage]]:
        """(index of the training stage whose model is tested, test) for each passkey entry of `run.stages`."""
        out, trained = [], -1
        for entry in (self.run.stages or []) if self.run is not None else []:
            if isinstance(entry, Stage):
                trained += 1
            else:
                out.append((trained, entry))
        return out

    def total_steps(self) -> int:
        return sum(s.steps for s in self.stages())

    def effective(self) -> dict:
        """The plan as JSON with every default filled in (`ulab plan --effective`, what the API stores)."""
        return self.model_dump(mode="json", exclude_none=True)


def field_choices() -> dict[str, list[Any]]:
    """The allowed values of every closed-choice field, by dotted name (a form's select options)."""
    import typing

    out: dict[str, list[Any]] = {}
    for name, cls in (("training", Training), ("run", RunSection)):
        for key, f in cls.model_fields.items():
            args = [a for a in typing.get_args(f.annotation) if a is not type(None)]
            literal = args[0] if len(args) == 1 and typing.get_origin(args[0]) is Literal else f.annotation
            if typing.get_origin(literal) is Literal:
                out[f"{name}.{key}"] = list(typing.get_args(literal))
    bounds = {m.__class__.__name__: m for m in Training.model_fields["zero_stage"].metadata}
    out["training.zero_stage"] = list(range(bounds["Ge"].ge, bounds["Le"].le + 1))
    return out


def section_defaults() -> dict[str, dict[str, Any]]:
    """Every section's defaults (fields without one are left out): what a form starts from."""
    out: dict[str, dict[str, Any]] = {}
    for name, cls in (("hardware", Hardware), ("parallel", Parallel), ("training", Training), ("run", RunSection)):
        out[name] = {k: f.default for k, f in cls.model_fields.items()
                     if not f.is_required() and f.default is not None}
    return out


# The plan a new planner form starts from (GET /api/plans/defaults answers it with every default filled in):
# the HF blog's Qwen3-4B long-context setup on one 4 x H100 node. CPU memory per node is Hardware's default, the one
# `ulab plan` uses too (one default, page and CLI).
EXAMPLE: dict[str, Any] = {
    "model": {"preset": "Qwen/Qwen3-4B"},
    "hardware": {"gpu": "H100-80GB", "gpus_per_node": 4, "num_nodes": 1},
    "parallel": {"sp_size": 4, "dp_size": 1},
    "training": {"seq_len": 65536, "grad_accum": 8, "offload_optimizer": True},
}
