"""Assemble the plan-v1 Estimate from a validated Spec."""
from __future__ import annotations

import math
from typing import Any

from .cost import estimate_cost
from .errors import FieldError
from .memory import GIB, estimate_memory
from .throughput import estimate_throughput
from .uncertainty import band, scaled, time_range
from .validation import Spec, validate
from .verdict import verdict_fields


def _r(x: float, nd: int = 3) -> float:
    return round(float(x), nd)


def _r_kept(x: float, nd: int) -> float:
    """`x` at `nd` decimals, or at 2 significant digits where those decimals would keep fewer: the tiny CPU plan's
    0.022 TFLOPS per GPU (its step is the host floor) must not read 0.0, which no measurement can be compared with
    (the run page's 10x rule) and no page can print as anything but 0. Figures of 10**-nd and more are as before."""
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, max(nd, 1 - math.floor(math.log10(abs(x)))))


def _sig(x: float) -> float:
    """Six significant digits: a tiny model's step (tens of microseconds on an H100) must not round to 0 s."""
    return float(f"{float(x):.6g}")


def memory_point_gib(section: dict) -> float:
    """The figure `fits` and the bands are read on: what nvidia-smi would show (plan-v1 `device_total_gib`)."""
    return float(section["device_total_gib"])


def memory_section(spec: Spec, mem: dict, method: str = "ulysses") -> dict:
    breakdown = {k: _r(v / GIB) for k, v in mem["breakdown"].items()}
    # Round the parts, then state the peak as their sum so the breakdown adds up exactly (plan-v1 invariant).
    peak = _r(sum(breakdown.values()))
    reserved = max(peak, _r(mem["reserved"] / GIB))
    device_total = max(reserved, _r(mem["device_total"] / GIB))
    capacity = float(spec.gpu.memory_gib)
    cpu = _r(mem["cpu_per_node"] / GIB, 1)
    b = band(spec, "memory", method)
    total_range = scaled(device_total, b)
    return {"peak_allocated_gib": peak, "device_total_gib": device_total, "gpu_capacity_gib": capacity,
            **verdict_fields(total_range[0], total_range[1], capacity, cpu, spec.cpu_gib_per_node),
            "device_total_gib_range": total_range,
            "peak_allocated_gib_range": scaled(peak, b), "reserved_gib_range": scaled(reserved, b),
            "headroom_gib_range": [_r(capacity - total_range[1]), _r(capacity - total_range[0])],
            "headroom_pct_range": [_r(100 * (capacity - total_range[1]) / capacity, 1),
                                   _r(100 * (capacity - total_range[0]) / capacity, 1)],
            "breakdown_gib": breakdown, "peak_phase": mem["peak_phase"],
            "reserved_gib": reserved,
            "allocator_stranded_gib": _r(mem["stranded"] / GIB),
            "context_and_nccl_gib": _r(device_total - reserved),
            "cpu_gib_per_node": cpu, "cpu_capacity_gib_per_node": spec.cpu_gib_per_node,
            "cpu_fits": cpu <= spec.cpu_gib_per_node,
            "cpu_breakdown_gib_per_node": {k: _r(v / GIB, 1) for k, v in mem["cpu_breakdown_per_node"].items()}}


def throughput_section(spec: Spec, tp: dict, method: str = "ulysses") -> dict:
    step, tps = tp["step_time_s"], tp["tokens_per_s"]
    lo, hi = (x / step for x in time_range(spec, step, method))  # the range as factors of the step
    return {"step_time_s": _sig(tp["step_time_s"]), "tokens_per_s": _r(tp["tokens_per_s"], 1),
            "step_time_s_range": [_sig(step * lo), _sig(step * hi)],
            "tokens_per_s_range": [_r(tps / hi, 1), _r(tps / lo, 1)],
            "sequences_per_step": spec.sequences_per_step, "tokens_per_step": spec.tokens_per_step,
            "time_per_billion_tokens_s": _sig(1e9 / tps),
            "time_per_billion_tokens_s_range": [_sig(1e9 / tps * lo), _sig(1e9 / tps * hi)],
            "tokens_per_s_per_gpu": _r(tp["tokens_per_s_per_gpu"], 1),
            "tflops_per_gpu": _r_kept(tp["tflops_per_gpu"], 1), "mfu": _r_kept(tp["mfu"], 4),
            "time_breakdown_s": {k: _sig(v) for k, v in tp["time_breakdown_s"].items()}}


def invalid(errors: list[FieldError], warnings: list[FieldError] | None = None) -> dict:
    return {"valid": False, "errors": errors, "warnings": list(warnings or []), "memory": None, "throughput": None}


def estimate_spec(spec: Spec, warnings: list | None = None) -> dict:
    mem = estimate_memory(spec)
    tp = estimate_throughput(spec)
    m = spec.model
    return {"valid": True, "errors": [], "warnings": list(warnings or []),
            "memory": memory_section(spec, mem), "throughput": throughput_section(spec, tp),
            "model": {"name": m.name, "params": m.total_params, "local_tokens_per_rank": spec.local_tokens}}


def estimate(plan: Any, train_tokens: int | None = None) -> dict:
    """plan-v1 Estimate for a plan (dict or Plan). Never raises for user errors: they come back as `valid: false`.
    With `train_tokens`, or a plan whose `run` section states its steps, `cost` says what the run will cost
    (plan/cost.py)."""
    v = validate(plan)
    if v.spec is None:
        return invalid(v.errors, v.warnings)
    return {**estimate_spec(v.spec, v.warnings), "cost": estimate_cost(v.spec, train_tokens)}


def fits(spec: Spec, end: str = "point") -> bool:
    """Whether a spec fits on the GPU and in host memory (the test the max-context search bisects on), read at one
    end of the memory band: "high" (the verdict's `fits`), "point" (the estimate itself) or "low"."""
    section = memory_section(spec, estimate_memory(spec))
    if not section["cpu_fits"]:
        return False
    lo, hi = section["device_total_gib_range"]
    x = {"high": hi, "point": section["device_total_gib"], "low": lo}[end]
    return x <= section["gpu_capacity_gib"]
