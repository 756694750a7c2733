"""Ulysses Lab planner: per-GPU memory and throughput of long-context training with Ulysses SP + DeepSpeed ZeRO.

A pure library (no web framework, no database, no torch at import time). Public API:

- `estimate(plan) -> dict`            plan-v1 Estimate (../shared/spec/plan-v1.md); never raises for user errors
- `max_seq_len(plan) -> dict`         `{"max_seq_len": N, "estimate": {...}}`
- `sweep(plan, sp_sizes, seq_lens)`   memory and tokens/s over seq_len for several sp_size values
- `exports(plan) -> dict`             Accelerate YAML, DeepSpeed JSON and launch command (the trainer's own files)
- `catalog() -> dict`                 built-in models and GPUs
- `traced_estimate(plan) -> dict`     activation + logits peak measured by running the real HF model under
                                      FakeTensorMode (imports torch/transformers lazily; seconds, no real memory)
"""
from __future__ import annotations

from .catalog import catalog
from .estimator import estimate
from .exports import exports
from .search import max_seq_len, sweep


def traced_estimate(plan: dict, **kwargs) -> dict:
    from .traced import traced_estimate as _traced

    return _traced(plan, **kwargs)


__all__ = ["catalog", "estimate", "exports", "max_seq_len", "sweep", "traced_estimate"]
