"""Probe runs, the pure part: the plans a probe trains (the plan's model at reduced depth, random weights, the
plan's real GPUs, sp, dp, ZeRO stage, offloads, kernels and seq_len), the depth line fitted to what they
measured, and the result: extrapolated to the model's depth, beside the planner's figures.

Why a line: every per-layer term (parameters, gradients, optimizer states, saved activations, the layer's share of
step time) grows with the number of layers; the embedding, the logits and loss, the framework and the allocator's
fixed costs do not. Least squares over the probed depths gives the slope (per layer) and the intercept (the rest).
Where that does not hold the result says so (`warnings`): a depth-independent term that dominates the small depths,
a residual off the line, offload overlap, ZeRO-3's fixed prefetch windows.

worker/probe.py runs the probe (torchrun, as `ulab train` does) and calls `summarize`.
"""
from __future__ import annotations

import copy
import math
from typing import Any

from .estimator import estimate_spec
from .validation import Spec, validate

DEPTHS = (1, 2, 4)
STEPS = 4  # per depth; the first step (start-up, allocator warm-up) is dropped
MEMORY = ("peak_allocated_gib", "reserved_gib", "device_total_gib")  # per rank
QUANTITIES = (*MEMORY, "step_time_s")
# the step's parts, where the trainer times them (its metrics records: seconds, the slowest rank); the probe reads
# them when present and says "not measured" otherwise
PARTS = ("forward_s", "backward_s", "optimizer_s")
NOT_MEASURED = "not measured"
# A depth-independent term above this share of the smallest probe's figure leaves the slope poorly determined.
INTERCEPT_DOMINATES = 0.75
# Points further off the fitted line than this (relative) mean the quantity is not linear in depth.
NONLINEAR_RESIDUAL = 0.05
FALLS = "not extrapolated: falls with depth"  # the source of a figure whose fitted slope is negative


class ProbeError(ValueError):
    """A plan that cannot be probed; the message names the field first."""


def full_depth(spec: Spec) -> int:
    return spec.model.num_hidden_layers


def probe_config(spec: Spec, depth: int) -> dict:
    """The Hugging Face config of the plan's model with `depth` layers: the same per-layer shapes."""
    cfg = spec.plan.model.config
    full = full_depth(spec)
    if cfg is not None:
        out = copy.deepcopy(cfg)
        for key, value in cfg.items():  # per-layer lists (layer_types, ...) keep their first `depth` entries
            if isinstance(value, list) and len(value) == full:
                out[key] = value[:depth]
        out["num_hidden_layers"] = depth
        return out
    m = spec.model
    out = {"model_type": m.model_type, "hidden_size": m.hidden_size, "num_hidden_layers": depth,
           "num_attention_heads": m.num_attention_heads, "num_key_value_heads": m.num_key_value_heads,
           "head_dim": m.head_dim, "intermediate_size": m.intermediate_size, "vocab_size": m.vocab_size,
           "tie_word_embeddings": m.tie_word_embeddings,
           "max_position_embeddings": max(m.max_position_embeddings or 0, spec.plan.training.seq_len)}
    if m.num_experts:
        out.update(num_experts=m.num_experts, num_experts_per_tok=m.experts_per_token,
                   moe_intermediate_size=m.moe_intermediate_size)
    return out


def probe_plan(data: Any, depth: int, steps: int, data_path: str, cuda: bool) -> dict:
    """The plan one probe depth trains: the model at `depth` layers with random weights, `steps` steps, no
    checkpoints, no evaluations, no smoke-test gate, on `data_path`. Everything else is the plan's. Raises
    ProbeError for a plan that does not validate."""
    v = validate(data)
    if v.spec is None or v.plan is None:
        first = v.errors[0] if v.errors else {"field": "plan", "message": "not valid"}
        raise ProbeError(f"{first['field']}: {first['message']}")
    plan = v.plan.effective()
    plan["model"] = {"config": probe_config(v.spec, depth)}
    run = {k: plan.get("run", {}).get(k) for k in ("learning_rate", "seed", "lr_scheduler", "weight_decay")
           if plan.get("run", {}).get(k) is not None}
    plan["run"] = {**run, "steps": steps, "warmup_steps": 0, "checkpoint_every": 0, "data": {"path": data_path},
                   "track_memory": True}
    if not cuda:  # the kernels that need a GPU: the CPU rehearsal of the probe runs without them
        plan["training"]["liger_kernel"] = False
    return plan


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = intercept + slope x; with the worst relative residual. Two or more distinct xs."""
    n = len(xs)
    if n < 2 or len(set(xs)) < 2:
        raise ValueError("a line needs two or more distinct depths")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = my - slope * mx
    residual = max((abs(y - (intercept + slope * x)) / abs(y) for x, y in zip(xs, ys, strict=True) if y),
                   default=0.0)
    return {"slope": slope, "intercept": intercept, "max_residual": residual}


def at(line: dict, depth: float) -> float:
    return line["intercept"] + line["slope"] * depth


def _rank_values(measured: list[dict], quantity: str, rank: int) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for m in measured:
        ranks = m.get("ranks") or []
        if m.get("status") == "ok" and rank < len(ranks) and ranks[rank].get(quantity) is not None:
            xs.append(float(m["depth"]))
            ys.append(float(ranks[rank][quantity]))
    return xs, ys


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, nd)


def summarize(data: Any, measured: list[dict], device: str) -> dict:
    """The probe's result from its depths' measurements.

    `measured`: one entry per depth, {"depth", "status": "ok" | "oom" | "failed", "reason", "ranks": [{"rank",
    "peak_allocated_gib", "reserved_gib", "device_total_gib"}], "step_time_s", "tokens_per_s", "loss_finite",
    "steps", "breakdown_s": {"forward_s", "backward_s", "optimizer_s"} or None where the trainer does not time the
    parts}. `device`: "cuda" or "cpu" (CPU ranks measure the trainer's live tensors; no allocator, no
    nvidia-smi)."""
    v = validate(data)
    assert v.spec is not None, "summarize a plan that validates"
    spec = v.spec
    depth = full_depth(spec)
    est = estimate_spec(spec)
    capacity = float(spec.gpu.memory_gib)
    ok = [m for m in measured if m.get("status") == "ok"]
    world = spec.world
    warnings: list[str] = []
    extrapolated: dict[str, Any] = {}
    fits: dict[str, dict] = {}
    source: dict[str, str] = {}
    direct = next((m for m in ok if m["depth"] == depth), None)
    reduced = [m for m in ok if m["depth"] != depth]  # the line is fitted on these only
    check: dict[str, dict] = {}  # with the full depth measured too: how far the line lands from it
    for q in MEMORY:
        per_rank: list[float | None] = []
        falls = False
        for r in range(world):
            xs, ys = _rank_values(reduced, q, r)
            line = fit_line(xs, ys) if len(set(xs)) >= 2 else None
            if line is not None and r == 0:
                fits[q] = {k: _round(x, 6) for k, x in line.items()}
            full_value = direct["ranks"][r].get(q) if direct is not None and r < len(direct["ranks"]) else None
            if full_value is not None and line is not None:
                mine = check.setdefault(q, {"extrapolated": [], "measured": [], "error": []})
                mine["extrapolated"].append(_round(at(line, depth)))
                mine["measured"].append(_round(full_value))
                mine["error"].append(_round(at(line, depth) / full_value - 1) if full_value else None)
            usable = line is not None and line["slope"] >= 0  # a figure that falls with depth is noise, not a line
            falls = falls or (line is not None and not usable)
            per_rank.append(full_value if full_value is not None else (
                at(line, depth) if line is not None and usable else None))
        values = [x for x in per_rank if x is not None]
        extrapolated[q] = _round(max(values)) if values else None
        extrapolated[f"{q}_per_rank"] = [_round(x) for x in per_rank] if values else None
        source[q] = "measured" if direct is not None and values else ("extrapolated" if values else (
            FALLS if falls else "not measured"))
    step_time, source["step_time_s"] = _scalar(reduced, direct, depth, "step_time_s", fits, check)
    extrapolated["step_time_s"] = _round(step_time, 6)
    parts: dict[str, float | None] = {}
    for part in PARTS:  # each part its own line: the optimizer step grows with parameters, forward with tokens too
        value, source[part] = _scalar(reduced, direct, depth, part, fits, check, in_breakdown=True)
        parts[part] = _round(value, 6)
    extrapolated["breakdown_s"] = parts if any(x is not None for x in parts.values()) else None
    extrapolated["tokens_per_s"] = _round(spec.tokens_per_step / step_time, 1) if step_time else None
    source["tokens_per_s"] = source["step_time_s"]
    warnings += _warnings(spec, reduced, fits, device)
    failed = [m for m in measured if m.get("status") != "ok"]
    if len(ok) < 2 and direct is None:
        warnings.append("fewer than two depths ran to the end: nothing to extrapolate from")
    mem, tp = est["memory"], est["throughput"]
    predicted = {"peak_allocated_gib": mem["peak_allocated_gib"], "reserved_gib": mem["reserved_gib"],
                 "device_total_gib": mem["device_total_gib"], "step_time_s": tp["step_time_s"],
                 "tokens_per_s": tp["tokens_per_s"], "gpu_capacity_gib": capacity, "fits": mem["fits"]}
    for section in ("memory", "throughput"):  # the planner's ranges, where it states them
        for k, x in est[section].items():
            if k.endswith("_range"):
                predicted[k] = x
    if "verdict" in est["memory"]:
        predicted["verdict"] = est["memory"]["verdict"]
    return {"plan_depth": depth, "depths": [m["depth"] for m in measured], "device": device, "world": world,
            "gpu": spec.gpu.name, "gpu_capacity_gib": capacity, "tokens_per_step": spec.tokens_per_step,
            "measured": measured, "extrapolated": extrapolated, "fits": fits, "source": source, "check": check,
            "predicted": predicted, "verdict": verdict(extrapolated, failed, capacity, device),
            "warnings": warnings}


def _scalar(reduced: list[dict], direct: dict | None, depth: int, name: str, fits: dict, check: dict,
            in_breakdown: bool = False) -> tuple[float | None, str]:
    """A per-step figure (the slowest rank's; `in_breakdown`: a part of the step's "breakdown_s") at the model's
    depth: measured there, else extrapolated from the reduced depths' line; (value, its source). Fills `fits` and,
    with the full depth measured too, `check`."""

    def get(m: dict) -> Any:
        return (m.get("breakdown_s") or {}).get(name) if in_breakdown else m.get(name)

    points = [(float(m["depth"]), float(get(m))) for m in reduced if get(m)]
    line = fit_line([x for x, _ in points], [y for _, y in points]) if len({x for x, _ in points}) >= 2 else None
    if line is not None:
        fits[name] = {k: _round(x, 6) for k, x in line.items()}
    full = get(direct) if direct is not None else None
    if full:
        if line is not None:
            check[name] = {"extrapolated": _round(at(line, depth), 6), "measured": _round(float(full), 6),
                           "error": _round(at(line, depth) / float(full) - 1)}
        return float(full), "measured"
    if line is not None and line["slope"] >= 0:
        return at(line, depth), "extrapolated"
    return None, (FALLS if line is not None else NOT_MEASURED)


def verdict(extrapolated: dict, failed: list[dict], capacity: float, device: str) -> dict:
    """{"fits": bool | None, "spare_gib", "needed_gib", "text"}: the line the planner page shows."""
    oom = [m for m in failed if m.get("status") == "oom"]
    if oom:
        d = min(m["depth"] for m in oom)
        return {"fits": False, "spare_gib": None, "needed_gib": None,
                "text": f"measured: does not fit even at {d} layer{'s' if d != 1 else ''}"}
    needed = next((extrapolated[q] for q in ("device_total_gib", "reserved_gib", "peak_allocated_gib")
                   if extrapolated.get(q) is not None), None)
    if needed is None:
        reason = "; ".join(m.get("reason") or m.get("status", "failed") for m in failed) or "no depth ran"
        return {"fits": None, "spare_gib": None, "needed_gib": None, "text": f"measured: no figure ({reason})"}
    where = " (CPU ranks: live tensors)" if device == "cpu" else ""
    spare = capacity - needed
    if spare >= 0:
        text = f"measured: fits with {spare:.{_digits(spare)}f} GiB to spare{where}"
    else:
        text = f"measured: does not fit, {needed:.{_digits(needed)}f} GiB of {capacity:g}{where}"
    return {"fits": spare >= 0, "spare_gib": _round(spare, 3), "needed_gib": _round(needed, 3), "text": text}


def _digits(x: float) -> int:
    return 0 if abs(x) >= 10 else (1 if abs(x) >= 1 else 3)


def _warnings(spec: Spec, ok: list[dict], fits: dict, device: str) -> list[str]:
    out = []
    small = min((m["depth"] for m in ok), default=None)
    for q, line in fits.items():
        if small is None or line["intercept"] is None:
            continue
        value = at(line, small)
        if value > 0 and line["intercept"] / value > INTERCEPT_DOMINATES:
            out.append(f"{q}: the depth-independent term (embedding, logits and loss, framework) is "
                       f"{line['intercept'] / value:.0%} of it at {small} layer{'s' if small != 1 else ''}; the "
                       f"per-layer slope is measured on the small rest, so the extrapolation is uncertain")
        if line["slope"] is not None and line["slope"] < 0:
            out.append(f"{q}: falls with depth (slope {line['slope']:.3g} per layer): noise or a fixed cost the "
                       "small depths do not reach; the extrapolation is not reliable")
        if (line["max_residual"] or 0) > NONLINEAR_RESIDUAL and len(ok) > 2:
            out.append(f"{q}: not linear in depth (a probed point is {line['max_residual']:.0%} off the line)")
    t = spec.plan.training
    if t.offload_optimizer or t.offload_params or t.checkpoint_offload:
        out.append("step_time_s: offloaded states or activations move while the GPU computes; how much of that "
                   "overlaps changes with depth, so the step time is less linear than the memory")
    if t.zero_stage == 3:
        out.append("ZeRO-3 gathers parameters in fixed prefetch windows (stage3_prefetch_bucket_size, "
                   "stage3_max_live_parameters) that a few small layers may not fill: the gathered-parameter term "
                   "can grow less than linearly")
    if device == "cpu":
        out.append("CPU ranks: memory is the trainer's count of live tensors (no allocator, no nvidia-smi), "
                   "step time is CPU time; the GPU figures need the plan's GPUs")
    return out


def text_table(result: dict) -> str:
    """`ulab probe --text`: measured per depth, extrapolated and predicted."""
    lines = [f"probe of a {result['plan_depth']}-layer model on {result['world']} rank(s) ({result['device']}); "
             f"plan GPU {result['gpu']} ({result['gpu_capacity_gib']:g} GiB)"]
    head = f"{'depth':>7} {'status':>7} {'alloc GiB (max rank)':>21} {'reserved':>9} {'nvsmi':>7} " \
           f"{'step s':>9} {'fwd/bwd/opt s':>20} {'tokens/s':>10} {'loss ok':>7}"
    lines.append(head)

    def cell(x, fmt):
        return "-" if x is None else format(x, fmt)

    def parts(b):  # forward/backward/optimizer seconds, or why not
        if not b or all(b.get(k) is None for k in PARTS):
            return NOT_MEASURED
        return "/".join(cell(b.get(k), ".3f") for k in PARTS)

    for m in result["measured"]:
        ranks = m.get("ranks") or []

        def top(q, ranks=ranks):
            vals = [r.get(q) for r in ranks if r.get(q) is not None]
            return max(vals) if vals else None

        lines.append(f"{m['depth']:>7} {m['status']:>7} {cell(top('peak_allocated_gib'), '.4f'):>21} "
                     f"{cell(top('reserved_gib'), '.3f'):>9} {cell(top('device_total_gib'), '.2f'):>7} "
                     f"{cell(m.get('step_time_s'), '.4f'):>9} {parts(m.get('breakdown_s')):>20} "
                     f"{cell(m.get('tokens_per_s'), '.1f'):>10} "
                     f"{cell(m.get('loss_finite'), ''):>7}")
    e, p = result["extrapolated"], result["predicted"]
    lines.append(f"{result['plan_depth']:>7} {'extrap':>7} {cell(e.get('peak_allocated_gib'), '.4f'):>21} "
                 f"{cell(e.get('reserved_gib'), '.3f'):>9} {cell(e.get('device_total_gib'), '.2f'):>7} "
                 f"{cell(e.get('step_time_s'), '.4f'):>9} {parts(e.get('breakdown_s')):>20} "
                 f"{cell(e.get('tokens_per_s'), '.1f'):>10}")
    lines.append(f"{result['plan_depth']:>7} {'planner':>7} {cell(p.get('peak_allocated_gib'), '.4f'):>21} "
                 f"{cell(p.get('reserved_gib'), '.3f'):>9} {cell(p.get('device_total_gib'), '.2f'):>7} "
                 f"{cell(p.get('step_time_s'), '.4f'):>9} {'':>20} {cell(p.get('tokens_per_s'), '.1f'):>10}")
    lines.append(result["verdict"]["text"])
    lines.append("source: " + ", ".join(f"{k} {v}" for k, v in result["source"].items()))
    lines += [f"warning: {w}" for w in result["warnings"]]
    return "\n".join(lines)
