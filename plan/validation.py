"""One entry for every reader of a plan: `validate(data)` parses it with the plan model, resolves the model and
GPU, checks the rules, and answers a `Validated` (the plan, the resolved `Spec` the estimators read, the errors
and the warnings). It never raises for user input.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from . import catalog as cat
from . import rules
from .errors import MISSING_HINTS, FieldError, field_errors
from .model import DTYPE_BYTES, Plan, Training
from .training_fields import TrainingFields

MISSING_HINTS["hardware.gpu"] = rules.known_gpus


@dataclass(frozen=True)
class Spec(TrainingFields):
    """A valid plan with its architecture and GPU resolved: everything the estimators read.

    Training switches are read through to the plan (`spec.tiled_mlp` is `plan.training.tiled_mlp`:
    plan/training_fields.py). `with_(seq_len=...)` is the cheap copy the searches make.
    """

    plan: Plan
    model: cat.ModelSpec
    gpu: cat.GpuSpec
    _t: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_t", self.plan.training)

    @property
    def training_section(self) -> Training:  # its fields: spec.zero_stage, spec.offload_optimizer, ...
        return self._t

    @property
    def sp(self) -> int:
        return self.plan.parallel.sp_size

    @property
    def dp(self) -> int:
        return self.plan.parallel.dp_size

    @property
    def world(self) -> int:
        return self.sp * self.dp

    @property
    def sequences_per_step(self) -> int:
        """The global batch: sequences per optimizer step (micro batch x grad_accum x dp; each SP group trains one
        sequence per micro batch slot)."""
        return self._t.micro_batch_size * self._t.grad_accum * self.dp

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step: the global batch at the plan's seq_len."""
        return self.sequences_per_step * self.seq_len

    @property
    def gpus_per_node(self) -> int:
        return self.plan.hardware.gpus_per_node

    @property
    def num_nodes(self) -> int:
        return self.plan.hardware.num_nodes

    @property
    def cpu_gib_per_node(self) -> float:
        return self.plan.hardware.cpu_memory_gib_per_node

    @property
    def attn(self) -> str:
        return self._t.attn_implementation

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self._t.dtype]

    @property
    def local_tokens(self) -> int:
        """Tokens one rank holds between the all-to-alls: its sequence shard times the micro batch."""
        return self._t.micro_batch_size * self._t.seq_len // self.sp

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.world // self.num_nodes)

    def with_(self, **changes: Any) -> Spec:
        """The same spec with some training, hardware or parallel fields changed, by name (`seq_len=...`,
        `num_nodes=...`). No validation: the caller keeps them valid (the searches do)."""
        plan = self.plan
        updates: dict[str, Any] = {}
        for section in ("training", "hardware", "parallel"):
            current = getattr(plan, section)
            mine = {k: v for k, v in changes.items() if k in type(current).model_fields}
            if mine:
                updates[section] = current.model_copy(update=mine)
        unknown = set(changes) - {k for s in updates.values() for k in type(s).model_fields}
        if unknown:
            raise TypeError(f"Spec.with_: no plan field named {', '.join(sorted(unknown))}")
        return replace(self, plan=plan.model_copy(update=updates))


@dataclass
class Validated:
    plan: Plan | None
    spec: Spec | None
    errors: list[FieldError]
    warnings: list[FieldError]

    @property
    def valid(self) -> bool:
        return self.spec is not None and not self.errors


def parse(data: Any) -> tuple[Plan | None, list[FieldError]]:
    """The plan model of `data` (a dict, or a Plan already), or None with the field errors."""
    if isinstance(data, Plan):
        return data, []
    try:
        return Plan.model_validate(data), []
    except ValidationError as e:
        return None, field_errors(e, Plan)


def validate(data: Any) -> Validated:
    plan, errors = parse(data)
    if plan is None:
        return Validated(None, None, errors, [])
    model, gpu, errors, warnings = rules.check(plan)
    if errors or model is None or gpu is None:
        return Validated(plan, None, errors, warnings)
    return Validated(plan, Spec(plan=plan, model=model, gpu=gpu), [], warnings)
