"""Ulysses Lab's plan: the one validated model of a training configuration, and everything computed from it.

A pure library: no web framework, no database, no torch at import time (`plan.traced` imports torch lazily, inside
its functions). The API, the command line and the trainer all import it; it imports nothing else of ours.

- `Plan` (plan.model)                 plan-v1 (+ the trainer's `run` section): fields, defaults, allowed values
- `validate(data) -> Validated`       the plan, its resolved Spec, errors and warnings (never raises)
- `estimate(plan) -> dict`            plan-v1 Estimate: per-GPU memory with a breakdown, throughput
- `max_seq_len(plan)`, `sweep(...)`   the longest context that fits; memory and tokens/s over seq_len and sp_size
- `exports(plan)`, `dry_run(plan)`    the DeepSpeed config, Accelerate settings and launch command it turns into
- `catalog.listing()`                 built-in models and GPUs, with the parameter count, FLOPs and peak TFLOPS
- `recommend(plan, longest)`          the configurations that fit, ranked, with reasons and near misses
- `fix(plan)`                         the fewest, cheapest changes that make a plan fit
- `compare_sp_methods(plan)`          Ulysses vs ring attention vs a hybrid (an estimate)
"""
from __future__ import annotations

from typing import Any

from . import catalog
from .errors import FieldError
from .estimator import estimate
from .exports import exports
from .fix import fix
from .launch import dry_run
from .model import Plan, RunSection
from .recommend import recommend
from .ring import compare as compare_sp_methods
from .search import max_seq_len, sweep
from .validation import Spec, Validated, validate


def traced_estimate(plan: Any, **kwargs: Any) -> dict:
    """Activation + logits peak measured by running the real HF model under FakeTensorMode (torch, seconds)."""
    from .traced import traced_estimate as _traced

    return _traced(plan, **kwargs)


__all__ = ["FieldError", "Plan", "RunSection", "Spec", "Validated", "catalog", "compare_sp_methods", "dry_run",
           "estimate", "exports", "fix", "max_seq_len", "recommend", "sweep", "traced_estimate", "validate"]
