"""The smallest change that makes a plan fit (`ulab plan --json F --fix`, `POST /api/estimate/fix`, and the run
page of a run that ended `oom`):

    {"changes": [{"field", "from", "to", "cost_pct"}], "plan", "estimate", "cost", "fits"}

The changes are the fewest that make the plan fit (GPU and host memory), and among those the ones with the best
predicted tokens/s. Candidates, cheapest first: the free ones (Liger, tiled logits loss, expandable segments), then
activation checkpointing and checkpoint offload, a larger sp inside a node, tiled MLP, ZeRO-3, optimizer offload,
parameter offload and micro batch 1. Fields the plan's `run` section or hardware fix are never touched.

A run that ended `oom` although its plan was predicted to fit shows the planner under-predicted it: its fix asks for
a predicted device total within capacity / (1 + MEASURED_OOM_MARGIN).
"""
from __future__ import annotations

import copy
import itertools
from typing import Any

from .estimator import estimate_spec, invalid
from .recommend import queue_attn
from .validation import Spec, validate

MAX_CHANGES = 4
# For a run that ran out of memory where the planner said it fits: the planner's memory error bound on the
# published rows it is checked against (bench/planner_accuracy.py: the HF blog's SP rows and the ALST max context
# within 10%), so a fix that leaves at least that much room covers the error that let the run OOM.
MEASURED_OOM_MARGIN = 0.10

FREE = {"training.liger_kernel", "training.tiled_logits_loss", "training.expandable_segments"}


def _candidates(spec: Spec, liger: bool = True) -> list[list[tuple[str, Any]]]:
    """Each candidate change as the field assignments it makes (a larger sp moves dp with it); `liger` False: the
    queue has no worker with Liger, so it is not proposed."""
    t = spec.plan.training
    out: list[list[tuple[str, Any]]] = []
    for name in ("liger_kernel", "tiled_logits_loss", "expandable_segments", "activation_checkpointing"):
        if name == "liger_kernel" and not liger:
            continue
        if not getattr(t, name):
            out.append([(f"training.{name}", True)])
    if not t.checkpoint_offload:
        out.append([("training.checkpoint_offload", True)])
    world, per_node = spec.world, spec.gpus_per_node
    m = spec.model
    for sp in range(spec.sp + 1, per_node + 1):
        if world % sp == 0 and m.num_attention_heads % sp == 0 and (
                m.num_key_value_heads % sp == 0 or sp % m.num_key_value_heads == 0) and t.seq_len % sp == 0:
            out.append([("parallel.sp_size", sp), ("parallel.dp_size", world // sp)])
    for name in ("tiled_mlp", "offload_optimizer", "offload_params"):
        if not getattr(t, name):
            out.append([(f"training.{name}", True)])
    if t.zero_stage != 3:
        out.append([("training.zero_stage", 3)])
    if t.micro_batch_size > 1:
        out.append([("training.micro_batch_size", 1)])
    return out


def _apply(data: dict, assignments: list[tuple[str, Any]]) -> dict:
    out = copy.deepcopy(data)
    for field, value in assignments:
        section, key = field.split(".")
        out.setdefault(section, {})[key] = value
    # a switch that needs another one brings it along (checkpoint offload needs checkpointing, parameter offload
    # needs ZeRO-3): counted as part of the same change
    t = out["training"]
    if t.get("checkpoint_offload"):
        t["activation_checkpointing"] = True
    if t.get("offload_params"):
        t["zero_stage"] = 3
    return out


def _diff(a: Spec, b: Spec | None) -> list[dict]:
    """The training and parallel fields that differ between two plans, as {"field", "from", "to"}."""
    if b is None:
        return []
    out = []
    for section in ("parallel", "training"):
        x, y = getattr(a.plan, section), getattr(b.plan, section)
        out += [{"field": f"{section}.{k}", "from": getattr(x, k), "to": getattr(y, k)}
                for k in type(x).model_fields if getattr(x, k) != getattr(y, k)]
    return out


def _fits(est: dict, margin: float) -> bool:
    """The fix aims for the verdict "fits": the high end of the memory band within the card (less `margin`)."""
    m = est["memory"]
    return m["device_total_gib_range"][1] <= m["gpu_capacity_gib"] / (1 + margin) and m["cpu_fits"]


def fix(data: Any, measured_oom: bool = False, kernels: list[str] | None = None, liger: bool = True) -> dict:
    """The fewest, then fastest, changes that make `data` fit; `measured_oom`: the plan ran out of memory.
    `kernels`: the attention kernels the plan's queue can run (its live workers'): a plan asking another is first
    moved to the best of these (recommend.queue_attn; the first change listed, even when the plan fits);
    `liger`: whether a worker of the queue has Liger (False: never proposed)."""
    v = validate(data)
    if v.spec is None or kernels is None or v.spec.attn in kernels:
        answer = _fix(data, measured_oom, liger)
        return answer if kernels is None else {**answer, "queue_kernels": kernels}
    runs = queue_attn(v.spec.gpu, kernels)
    if not runs:
        answer = _fix(data, measured_oom, liger)
        return {**answer, "queue_kernels": kernels, "fits": False,
                "cost": f"training.attn_implementation: {v.spec.attn} is not installed on any worker of the plan's "
                        f"queue, nor any kernel the planner proposes (they have {', '.join(kernels) or 'none'}); "
                        + answer["cost"]}
    base_plan = v.spec.plan.model_dump(mode="json", exclude_none=True)
    base_plan.pop("run", None)
    moved = _apply(base_plan, [("training.attn_implementation", runs[0])])
    answer = _fix(moved, measured_oom, liger)
    first = {"field": "training.attn_implementation", "from": v.spec.attn, "to": runs[0], "cost_pct": None}
    after = validate(moved)
    if after.spec is not None:
        first["cost_pct"] = round((estimate_spec(after.spec)["throughput"]["step_time_s"]
                                   / estimate_spec(v.spec)["throughput"]["step_time_s"] - 1) * 100, 1)
    return {**answer, "changes": [first, *answer["changes"]], "queue_kernels": kernels,
            "cost": f"{runs[0]} instead of {v.spec.attn} (what the queue's workers have); " + answer["cost"]}


def _fix(data: Any, measured_oom: bool, liger: bool) -> dict:
    v = validate(data)
    if v.spec is None:
        return {"changes": [], "plan": None, "estimate": invalid(v.errors, v.warnings), "cost": "not a valid plan",
                "fits": False}
    spec = v.spec
    base_plan = spec.plan.model_dump(mode="json", exclude_none=True)
    base_plan.pop("run", None)
    est0 = estimate_spec(spec, v.warnings)
    margin = 0.0
    if measured_oom and est0["memory"]["fits"]:
        margin = MEASURED_OOM_MARGIN
    if _fits(est0, margin):
        return {"changes": [], "plan": spec.plan.effective(), "estimate": est0, "cost": "none: the plan fits",
                "fits": True}
    step0 = est0["throughput"]["step_time_s"]
    cands = _candidates(spec, liger)
    best: tuple | None = None
    for n in range(1, MAX_CHANGES + 1):
        for combo in itertools.combinations(cands, n):
            fields = [f for c in combo for f, _ in c]
            if len(set(fields)) != len(fields):
                continue
            trial = validate(_apply(base_plan, [a for c in combo for a in c]))
            if trial.spec is None:
                continue
            est = estimate_spec(trial.spec, trial.warnings)
            if not _fits(est, margin):
                continue
            tps = est["throughput"]["tokens_per_s"]
            if best is None or tps > best[0]:
                best = (tps, combo, trial, est)
        if best is not None:
            break
    if best is None:
        return {"changes": [], "plan": spec.plan.effective(), "estimate": est0, "fits": False,
                "cost": f"no set of up to {MAX_CHANGES} changes fits; shorten training.seq_len "
                        "(ulab plan --max-seq finds the longest that fits)"}
    _, combo, trial, est = best
    assert trial.spec is not None
    changes: list[dict] = []
    for c in combo:
        alone = validate(_apply(base_plan, c))
        pct = None
        if alone.spec is not None:
            pct = round((estimate_spec(alone.spec)["throughput"]["step_time_s"] / step0 - 1) * 100, 1)
        changes += [{**d, "cost_pct": pct} for d in _diff(spec, alone.spec) if d["field"] not in
                    {x["field"] for x in changes}]
    step = est["throughput"]["step_time_s"]
    pct_total = (step / step0 - 1) * 100
    cost = (f"{pct_total:+.1f}% step time ({step0:.4g} s -> {step:.4g} s); "
            f"{est['memory']['device_total_gib']:.1f} of {est['memory']['gpu_capacity_gib']:.0f} GiB per GPU")
    if all(f in FREE for c in combo for f, _ in c) and pct_total < 0.5:   # no slower (Liger is faster)
        cost = "free: " + cost
    if margin:
        cost += f" (the run ran out of memory: {MEASURED_OOM_MARGIN:.0%} room left for the planner's error)"
    return {"changes": changes, "plan": trial.spec.plan.effective(), "estimate": est, "cost": cost, "fits": True}
