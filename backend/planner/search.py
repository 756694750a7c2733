"""Max-context search and sweeps over (sp_size, seq_len) for the planner charts."""
from __future__ import annotations

import copy

from .estimator import estimate_spec, fits
from .validate import Spec, parse

MAX_SEARCH_TOKENS = 2 ** 27           # 134M tokens: far beyond any published run (ALST: 15M on 32 GPUs)
MAX_DEFAULT_SP = 64
MAX_DEFAULT_SERIES = 8


def _plan_with(plan: dict, **training) -> dict:
    p = copy.deepcopy(plan) if isinstance(plan, dict) else plan
    if isinstance(p, dict):
        t = p.get("training")
        p["training"] = {**(t if isinstance(t, dict) else {}), **training}
    return p


def _sp_of(plan) -> int:
    try:
        sp = plan["parallel"]["sp_size"]
        return sp if isinstance(sp, int) and sp > 0 else 1
    except (KeyError, TypeError):
        return 1


def max_seq_for_spec(spec: Spec) -> int:
    """Largest seq_len, a multiple of sp_size, that fits (0 if not even sp_size tokens fit).

    Memory is monotone non-decreasing in seq_len (every term is a non-negative polynomial in it), so bisect on
    k = seq_len / sp_size: ~30 evaluations of the analytical model, well under a millisecond each.
    """
    sp = spec.sp
    if not fits(spec.with_(seq_len=sp)):
        return 0
    lo, hi = 1, 2
    limit = MAX_SEARCH_TOKENS // sp
    while hi <= limit and fits(spec.with_(seq_len=hi * sp)):
        lo, hi = hi, hi * 2
    if hi > limit:
        return limit * sp if fits(spec.with_(seq_len=limit * sp)) else _bisect(spec, lo, limit) * sp
    return _bisect(spec, lo, hi) * sp


def _bisect(spec: Spec, lo: int, hi: int) -> int:
    """lo fits, hi does not; returns the largest fitting k."""
    sp = spec.sp
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(spec.with_(seq_len=mid * sp)):
            lo = mid
        else:
            hi = mid
    return lo


def max_seq_len(plan) -> dict:
    """`{"max_seq_len": N, "estimate": {...}}`: the longest seq_len (multiple of sp_size) for which the GPU
    (`fits`) and host memory (`cpu_fits`) suffice; the estimate is at that length. An invalid plan answers
    `max_seq_len: null` with the invalid estimate (its seq_len is ignored: the search sets it)."""
    sp = _sp_of(plan)
    spec, errors, warnings = parse(_plan_with(plan, seq_len=sp))
    if spec is None:
        return {"max_seq_len": None, "estimate": {"valid": False, "errors": errors, "warnings": warnings,
                                                  "memory": None, "throughput": None}}
    n = max_seq_for_spec(spec)
    at = spec.with_(seq_len=max(n, sp))
    _, _, warnings = parse(_plan_with(plan, seq_len=at.seq_len))
    return {"max_seq_len": n, "estimate": estimate_spec(at, warnings)}


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


def _hardware_for_world(plan: dict, world: int) -> dict:
    hw = dict(plan.get("hardware") or {}) if isinstance(plan.get("hardware"), dict) else {}
    per_node = hw.get("gpus_per_node") if isinstance(hw.get("gpus_per_node"), int) and hw["gpus_per_node"] > 0 else 8
    if world <= per_node or world % per_node:
        hw.update(gpus_per_node=world, num_nodes=1)
    else:
        hw.update(gpus_per_node=per_node, num_nodes=world // per_node)
    return hw


def sweep(plan, sp_sizes: list[int] | None = None, seq_lens: list[int] | None = None) -> dict:
    """Memory and tokens/s over seq_len for several sp_size values (`POST /api/estimate/sweep`).

    For each sp_size the GPU count follows (world = sp_size x dp_size, dp_size kept). Each seq_len is rounded
    down to a multiple of that sp_size. Invalid sp sizes come back with `valid: false` and their errors."""
    sp0 = _sp_of(plan)
    base, errors, warnings = parse(_plan_with(plan, seq_len=sp0))
    if base is None:
        return {"valid": False, "errors": errors, "seq_lens": [], "series": [], "gpu_capacity_gib": None}
    dp = base.dp
    sps = list(sp_sizes) if sp_sizes else default_sp_sizes(base)
    specs = {}
    series_errors = {}
    for sp in sps:
        if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
            series_errors[sp] = [{"field": "sp_sizes", "message": f"sp_size must be a positive integer, got {sp!r}"}]
            continue
        p = copy.deepcopy(plan)
        p["parallel"] = {**(plan.get("parallel") or {}), "sp_size": sp, "dp_size": dp}
        p["hardware"] = _hardware_for_world(plan, sp * dp)
        s, errs, _ = parse(_plan_with(p, seq_len=sp))
        if s is None:
            series_errors[sp] = errs
        else:
            specs[sp] = s
    max_seqs = {sp: max_seq_for_spec(s) for sp, s in specs.items()}
    grid = sorted(set(int(x) for x in seq_lens)) if seq_lens else default_seq_lens(max(max_seqs.values(), default=0))
    series = []
    for sp in sps:
        if sp in series_errors:
            series.append({"sp_size": sp, "valid": False, "errors": series_errors[sp], "max_seq_len": None,
                           "peak_allocated_gib": [None] * len(grid), "device_total_gib": [None] * len(grid),
                           "tokens_per_s": [None] * len(grid), "fits": [None] * len(grid)})
            continue
        s = specs[sp]
        row = {"sp_size": sp, "valid": True, "gpus": s.world, "max_seq_len": max_seqs[sp],
               "peak_allocated_gib": [], "device_total_gib": [], "tokens_per_s": [], "fits": []}
        for n in grid:
            seq = max(sp, n // sp * sp)
            e = estimate_spec(s.with_(seq_len=seq))
            row["peak_allocated_gib"].append(e["memory"]["peak_allocated_gib"])
            row["device_total_gib"].append(e["memory"]["device_total_gib"])
            row["tokens_per_s"].append(e["throughput"]["tokens_per_s"])
            row["fits"].append(e["memory"]["fits"] and e["memory"]["cpu_fits"])
        series.append(row)
    return {"valid": True, "errors": [], "seq_lens": grid, "series": series,
            "gpu_capacity_gib": float(base.gpu.memory_gib)}
