"""Max-context search and sweeps over (sp_size, seq_len) for the planner charts."""
from __future__ import annotations

from typing import Any

from .estimator import estimate_spec, fits, invalid
from .model import Plan
from .validation import Spec, parse, validate

MAX_SEARCH_TOKENS = 2 ** 27           # 134M tokens: far beyond any published run (ALST: 15M on 32 GPUs)
MAX_DEFAULT_SP = 64
MAX_DEFAULT_SERIES = 8


def at_seq_len(plan: Plan, seq_len: int) -> Plan:
    """The plan at another seq_len, without its run section (a search estimates the plan, not the run)."""
    return plan.model_copy(update={"training": plan.training.model_copy(update={"seq_len": seq_len}), "run": None})


def max_seq_for_spec(spec: Spec, end: str = "point") -> int:
    """Largest seq_len, a multiple of sp_size, that fits (0 if not even sp_size tokens fit).

    Memory is monotone non-decreasing in seq_len (every term is a non-negative polynomial in it), so bisect on
    k = seq_len / sp_size: ~30 evaluations of the analytical model, well under a millisecond each.
    """
    sp = spec.sp
    if not fits(spec.with_(seq_len=sp), end):
        return 0
    lo, hi = 1, 2
    limit = MAX_SEARCH_TOKENS // sp
    while hi <= limit and fits(spec.with_(seq_len=hi * sp), end):
        lo, hi = hi, hi * 2
    if hi > limit:
        return limit * sp if fits(spec.with_(seq_len=limit * sp), end) else _bisect(spec, lo, limit, end) * sp
    return _bisect(spec, lo, hi, end) * sp


def _bisect(spec: Spec, lo: int, hi: int, end: str = "point") -> int:
    """lo fits, hi does not; returns the largest fitting k."""
    sp = spec.sp
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(spec.with_(seq_len=mid * sp), end):
            lo = mid
        else:
            hi = mid
    return lo


def max_seq_len(data: Any) -> dict:
    """`{"max_seq_len": N, "estimate": {...}}`: the longest seq_len (multiple of sp_size) for which the GPU
    (`fits`: the memory range's high end fits) and host memory (`cpu_fits`) suffice, i.e. `safe`; the estimate is
    at that length. Beside it `likely` (the point estimate fits) and `optimistic` (the range's low end fits). An
    invalid plan answers `max_seq_len: null` with the invalid estimate (its seq_len is ignored: the search sets
    it)."""
    plan, errors = parse(data)
    if plan is None:
        return {"max_seq_len": None, "likely": None, "safe": None, "optimistic": None, "estimate": invalid(errors)}
    sp = plan.parallel.sp_size
    v = validate(at_seq_len(plan, sp))
    if v.spec is None:
        return {"max_seq_len": None, "likely": None, "safe": None, "optimistic": None,
                "estimate": invalid(v.errors, v.warnings)}
    safe = max_seq_for_spec(v.spec, "high")
    at = validate(at_seq_len(plan, max(safe, sp)))  # the warnings at that length
    return {"max_seq_len": safe, "likely": max_seq_for_spec(v.spec), "safe": safe,
            "optimistic": max_seq_for_spec(v.spec, "low"), "estimate": estimate_spec(at.spec or v.spec, at.warnings)}


def _kv_ok(kv: int, sp: int) -> bool:
    return kv % sp == 0 or sp % kv == 0


def default_sp_sizes(spec: Spec) -> list[int]:
    m = spec.model
    heads, kv = m.num_attention_heads, m.num_key_value_heads
    cands = [d for d in range(1, min(heads, MAX_DEFAULT_SP) + 1) if heads % d == 0 and _kv_ok(kv, d)]
    pow2 = [d for d in cands if d & (d - 1) == 0]
    rest = [d for d in cands if d not in pow2]
    return sorted((pow2 + rest)[:MAX_DEFAULT_SERIES])


def default_seq_lens(top: int) -> list[int]:
    """Log-spaced grid (powers of two and their 1.5x) from 4K up to just past `top` tokens."""
    out, p = [], 4096
    top = max(top, 8192)
    while p <= min(2 * top, MAX_SEARCH_TOKENS):
        out += [p, p * 3 // 2]
        p *= 2
    return sorted(x for x in out if x <= min(2 * top, MAX_SEARCH_TOKENS))


def sweep(data: Any, sp_sizes: list[int] | None = None, seq_lens: list[int] | None = None) -> dict:
    """Memory and tokens/s over seq_len for several sp_size values (`POST /api/estimate/sweep`).

    The plan's GPU count is kept: for each sp_size, dp_size = GPUs / sp_size (the hardware never changes, so a
    row is a layout of the GPUs the user has). An sp_size that does not divide the GPU count, and any other invalid
    one, comes back with `valid: false` and its errors. Each seq_len is rounded down to a multiple of sp_size.
    Default sp sizes: the model's head-compatible sizes that divide the GPU count."""
    plan, errors = parse(data)
    v = validate(at_seq_len(plan, plan.parallel.sp_size)) if plan is not None else None
    if v is None or v.spec is None:
        return {"valid": False, "errors": v.errors if v else errors, "seq_lens": [], "series": [],
                "gpu_capacity_gib": None}
    base = v.spec
    world = base.world
    sps = list(sp_sizes) if sp_sizes else [sp for sp in default_sp_sizes(base) if world % sp == 0]
    specs: dict[int, Spec] = {}
    series_errors: dict[int, list] = {}
    for sp in sps:
        if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
            series_errors[sp] = [{"field": "sp_sizes", "message": f"sp_size must be a positive integer, got {sp!r}"}]
            continue
        if world % sp:
            series_errors[sp] = [{"field": "parallel.sp_size", "message": f"sp_size {sp} does not divide the plan's "
                                                                          f"{world} GPUs"}]
            continue
        p = at_seq_len(base.plan.model_copy(update={"parallel": base.plan.parallel.model_copy(
            update={"sp_size": sp, "dp_size": world // sp})}), sp)
        s = validate(p)
        if s.spec is None:
            series_errors[sp] = s.errors
        else:
            specs[sp] = s.spec
    max_seqs = {sp: max_seq_for_spec(s) for sp, s in specs.items()}
    grid = sorted(set(int(x) for x in seq_lens)) if seq_lens else default_seq_lens(max(max_seqs.values(), default=0))
    series = []
    for sp in sps:
        if sp in series_errors:
            series.append({"sp_size": sp, "valid": False, "errors": series_errors[sp], "max_seq_len": None,
                           "safe_max_seq_len": None,
                           "peak_allocated_gib": [None] * len(grid), "device_total_gib": [None] * len(grid),
                           "tokens_per_s": [None] * len(grid), "fits": [None] * len(grid)})
            continue
        spec = specs[sp]
        row: dict = {"sp_size": sp, "dp_size": spec.dp, "valid": True, "errors": [], "gpus": spec.world,
                     "max_seq_len": max_seqs[sp], "safe_max_seq_len": max_seq_for_spec(spec, "high"),
                     "peak_allocated_gib": [], "device_total_gib": [], "tokens_per_s": [], "fits": []}
        for n in grid:
            seq = max(sp, n // sp * sp)
            e = estimate_spec(spec.with_(seq_len=seq))
            row["peak_allocated_gib"].append(e["memory"]["peak_allocated_gib"])
            row["device_total_gib"].append(e["memory"]["device_total_gib"])
            row["tokens_per_s"].append(e["throughput"]["tokens_per_s"])
            row["fits"].append(e["memory"]["fits"] and e["memory"]["cpu_fits"])
        series.append(row)
    return {"valid": True, "errors": [], "seq_lens": grid, "series": series,
            "gpu_capacity_gib": float(base.gpu.memory_gib)}
