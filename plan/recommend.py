"""Recommend: the configurations that fit a model on given GPUs at a target seq_len (or the longest one), ranked.

`ulab plan --json F --recommend [--longest]`, `POST /api/estimate/recommend`. F gives the model, the hardware and
`training.seq_len`; any other training or parallel field F sets is locked. The answer (docs/plan-v1.md, Additions):

    {"recommendations": [{"plan", "estimate", "reasons"}], "rejected": [{"plan", "why"}]}

Search (pruned, not enumerated: about a thousand memory evaluations for 64 GPUs):
- structures: every valid sp (heads % sp == 0, kv heads compatible, seq_len % sp == 0) with dp = world / sp, the ZeRO
  stages 3, 2, 1 and the attention kernels (FlashAttention-2; FlashAttention-3 on Hopper);
- for each structure a ladder of memory savers in order of speed cost: the free ones (Liger, tiled loss,
  expandable segments are not searched: they are the user's), then activation checkpointing, checkpoint offload,
  tiled MLP, optimizer offload, parameter offload. The first rung that fits is kept, then each costly saver on it
  is dropped in turn (a later saver may make an earlier one unnecessary). A lower ZeRO stage is tried only when
  ZeRO-3 fits with its rung: it needs more memory, never less.
- micro batch 2 and 4 are tried on the best few (they fill the GEMMs; the memory grows with them).
- the global batch (sequences, hence tokens, per optimizer step: plan.validation.Spec.sequences_per_step) is held at
  the plan's (or `global_batch`) by setting grad_accum = batch / (micro batch x dp), so every option trains the same
  tokens per step and tokens/s ranks them as step time would; a layout whose dp x micro batch does not divide the
  batch is a rejected option saying so. A plan that states no batch (neither training.grad_accum nor
  parallel.dp_size) has none to hold: each option trains its own, and its card says which. With `vary_batch`
  grad_accum stays the plan's and the batch follows dp.
- every option names the kernels it needs (`kernels`); with `kernels` known (the queue's live workers), an option
  needing one they lack sorts after every option that does not (`missing_kernels`, `unavailable`).
- "longest": every structure with every saver on is bisected for its longest seq_len, then the savers that length
  does not need are dropped.
"""
from __future__ import annotations

import math
from typing import Any

from .cost import estimate_cost
from .estimator import estimate_spec, invalid, memory_section
from .memory import estimate_memory
from .model import Plan
from .search import at_seq_len, default_sp_sizes, max_seq_for_spec
from .throughput import estimate_throughput, gpu_class
from .validation import Spec, parse, validate

# Memory savers, cheapest first (their speed cost in the throughput model: none for Liger and the tiled loss; one
# more forward of every layer for checkpointing; PCIe copies hidden behind compute for checkpoint offload; the
# MLP's recompute for tiled MLP; the CPU optimizer step for optimizer offload; parameter traffic over PCIe).
FREE_SAVERS = ("liger_kernel", "tiled_logits_loss")
COSTLY_SAVERS = ("activation_checkpointing", "checkpoint_offload", "tiled_mlp", "offload_optimizer", "offload_params")
SAVERS = FREE_SAVERS + COSTLY_SAVERS
ZERO_STAGES = (3, 2, 1)
MICRO_BATCHES = (2, 4)
TOP = 5
REJECTED = 5


def _locked(data: dict) -> set[str]:
    """Training and parallel fields the plan file sets (seq_len aside): the search keeps them."""
    out = {f"training.{k}" for k in (data.get("training") or {}) if k != "seq_len"}
    out |= {f"parallel.{k}" for k in (data.get("parallel") or {})}
    return out


def _fits(spec: Spec, end: str = "point") -> tuple[bool, dict]:
    """Whether the search keeps a candidate: host memory suffices and its point estimate fits (verdict "fits" or
    "tight"; the ranking puts every "fits" first), or with end="high" the band's high end does (verdict "fits")."""
    sec = memory_section(spec, estimate_memory(spec))
    gpu = sec["verdict"] == "fits" if end == "high" else sec["device_total_gib"] <= sec["gpu_capacity_gib"]
    return gpu and sec["cpu_fits"], sec


def _verdict(spec: Spec) -> str:
    return memory_section(spec, estimate_memory(spec))["verdict"]


def _valid_switches(sw: dict[str, Any]) -> bool:
    if sw.get("checkpoint_offload") and not sw.get("activation_checkpointing"):
        return False
    if sw.get("offload_params") and sw.get("zero_stage") != 3:
        return False
    if sw.get("offload_optimizer") and sw.get("zero_stage") == 0:
        return False
    return True


def queue_attn(gpu: Any, kernels: list[str] | None) -> list[str]:
    """The attention kernels a search tries on `gpu`: FlashAttention-2 (and 3 on Hopper); with `kernels` (what the
    queue's live workers report: backend/workers), only those the queue has, or its best other one (sdpa first)
    when it has no flash kernel."""
    attns = ["flash_attention_2", "flash_attention_3"] if gpu_class(gpu) == "hopper" else ["flash_attention_2"]
    if kernels is None:
        return attns
    have = [a for a in attns if a in kernels]
    return have or [a for a in FALLBACK_ATTN if a in kernels][:1]


FALLBACK_ATTN = ("sdpa", "flex_attention", "eager")


class _Search:
    def __init__(self, base: Spec, locked: set[str], end: str = "point", kernels: list[str] | None = None,
                 batch: int | None = None):
        self.base, self.locked, self.end, self.kernels, self.batch = base, locked, end, kernels, batch
        self.evaluated: dict[tuple, tuple[bool, dict, Spec]] = {}
        self.rejected: dict[tuple, str] = {}
        self.batch_misses: list[tuple[Spec, str]] = []

    def grad_accum(self, dp: int, micro_batch: int) -> int | None:
        """The grad_accum that holds the global batch at `dp` x `micro_batch` (the plan's when the batch varies);
        None when that product does not divide the batch."""
        if self.batch is None:
            return self.base.plan.training.grad_accum
        per_accum = dp * micro_batch
        return self.batch // per_accum if self.batch % per_accum == 0 else None

    def free(self, name: str) -> bool:
        section = "parallel" if name in ("sp_size", "dp_size") else "training"
        return f"{section}.{name}" not in self.locked

    def spec(self, src: Spec | None = None, **changes: Any) -> Spec:
        """`src` (default: the plan) with the unlocked ones of `changes`."""
        src = src or self.base
        keep = {k: v for k, v in changes.items() if self.free(k)}
        return src.with_(**keep)

    def evaluate(self, spec: Spec) -> tuple[bool, dict]:
        t = spec.plan.training
        key = (spec.sp, spec.dp, spec.seq_len, t.model_dump_json())
        if key not in self.evaluated:
            ok, sec = _fits(spec, self.end)
            self.evaluated[key] = (ok, sec, spec)
        ok, sec, _ = self.evaluated[key]
        return ok, sec

    def switches(self, spec: Spec) -> dict[str, Any]:
        t = spec.plan.training
        return {k: getattr(t, k) for k in SAVERS + ("zero_stage", "attn_implementation", "micro_batch_size")}


def _structures(s: _Search) -> list[dict]:
    base = s.base
    world = base.world
    sps = [base.sp] if not s.free("sp_size") else [d for d in default_sp_sizes_all(base) if world % d == 0]
    if not s.free("dp_size"):
        sps = [sp for sp in sps if sp * base.dp == world]
    sps = [sp for sp in sps if base.seq_len % sp == 0]
    zs = ZERO_STAGES if s.free("zero_stage") else (base.zero_stage,)
    attns = searched_attn(base.gpu, s.kernels)
    if not s.free("attn_implementation"):
        attns = [base.attn] if s.kernels is None or base.attn in s.kernels else []
    out = []
    mb = base.plan.training.micro_batch_size
    for sp in sps:
        ga = s.grad_accum(world // sp, mb)
        if ga is None:
            s.batch_misses.append((s.spec(None, sp_size=sp, dp_size=world // sp), _batch_miss(s, world // sp, mb)))
            continue
        out += [{"sp_size": sp, "dp_size": world // sp, "grad_accum": ga, "zero_stage": z, "attn_implementation": a}
                for z in zs for a in attns]
    return out


def _batch_miss(s: _Search, dp: int, micro_batch: int) -> str:
    return (f"dp {dp} x micro batch {micro_batch} does not divide the global batch of {s.batch} sequences per step "
            f"(let Recommend vary the global batch to see it)")


def searched_attn(gpu: Any, kernels: list[str] | None) -> list[str]:
    """The attention kernels the search tries: the flash ones for `gpu` whatever the queue has (an option needing one
    the queue lacks sorts last, saying so), and the queue's best other one when it has no flash kernel."""
    attns = queue_attn(gpu, None)
    if kernels is not None and not any(a in kernels for a in attns):
        attns += queue_attn(gpu, kernels)
    return attns


def needed_kernels(spec: Spec) -> list[str]:
    """The kernels a plan needs installed on its workers: its attention implementation, and Liger when it is on."""
    return [spec.attn] + (["liger_kernel"] if spec.plan.training.liger_kernel else [])


def _missing(spec: Spec, kernels: list[str] | None, liger: bool) -> list[str]:
    """The kernels `spec` needs that the queue's live workers lack (none when they are unknown)."""
    if kernels is None:
        return []
    return [k for k in needed_kernels(spec) if (k not in kernels if k != "liger_kernel" else not liger)]


def default_sp_sizes_all(spec: Spec) -> list[int]:
    """Every sp the model's heads allow, up to the world size."""
    m = spec.model
    heads, kv = m.num_attention_heads, m.num_key_value_heads
    return [d for d in range(1, min(heads, spec.world) + 1)
            if heads % d == 0 and (kv % d == 0 or d % kv == 0)] or default_sp_sizes(spec)


def _ladder(s: _Search, struct: dict) -> Spec | None:
    """The first rung of the saver ladder that fits, with unneeded costly savers dropped; None if none fits."""
    sw: dict[str, Any] = {**struct, **{k: False for k in COSTLY_SAVERS if s.free(k)}}
    for k in FREE_SAVERS:
        if s.free(k):
            sw[k] = False
    rungs = [dict(sw)]
    for k in SAVERS:
        if s.free(k):
            sw[k] = True
            if _valid_switches(sw):
                rungs.append(dict(sw))
    for rung in rungs:
        spec = s.spec(None, **rung)
        ok, sec = s.evaluate(spec)
        if ok:
            return _drop_unneeded(s, spec)
        s.rejected[_key(spec)] = _why(sec)
    return None


def _drop_unneeded(s: _Search, spec: Spec) -> Spec:
    """Drop each saver the fitting `spec` does not need: a costly one when the plan still fits and runs no slower
    without it, a free one when it still fits and the saver saved no memory."""
    best = spec
    for k in COSTLY_SAVERS + FREE_SAVERS:
        if not s.free(k) or not getattr(best.plan.training, k):
            continue
        sw: dict[str, Any] = {k: False}
        if k == "activation_checkpointing":
            sw["checkpoint_offload"] = False
        if not _valid_switches({**s.switches(best), **sw}):
            continue
        cand = s.spec(best, **sw)
        ok, sec = s.evaluate(cand)
        if not ok:
            continue
        if k in FREE_SAVERS:
            _, mine = s.evaluate(best)
            if sec["device_total_gib"] - mine["device_total_gib"] < 0.05:
                best = cand
        elif _tps(cand) >= _tps(best):
            best = cand
    return best


def _tps(spec: Spec) -> float:
    return estimate_throughput(spec)["tokens_per_s"]


def _key(spec: Spec) -> tuple:
    return (spec.sp, spec.dp, spec.seq_len, spec.plan.training.model_dump_json())


def _why(sec: dict) -> str:
    if sec["device_total_gib"] > sec["gpu_capacity_gib"]:
        b = sec["breakdown_gib"]
        big = max(b, key=lambda k: b[k])
        return (f"does not fit: {sec['device_total_gib']:.1f} GiB device total of {sec['gpu_capacity_gib']:.0f} GiB "
                f"({big.replace('_', ' ')} {b[big]:.1f} GiB)")
    return (f"host memory: {sec['cpu_gib_per_node']:.0f} GiB per node of {sec['cpu_capacity_gib_per_node']:.0f} GiB")


def reasons(spec: Spec, est: dict) -> list[str]:
    """One line per choice that matters, from the estimate and from the same plan with that choice undone."""
    out = []
    t = spec.plan.training
    m = est["memory"]
    if spec.sp > 1:
        if spec.sp <= spec.gpus_per_node:
            out.append(f"sp {spec.sp} keeps the all-to-all inside one NVLink node")
        else:
            out.append(f"sp {spec.sp} spans {spec.sp // spec.gpus_per_node} nodes: the all-to-all crosses the "
                       f"inter-node link ({est['throughput']['time_breakdown_s']['all_to_all']:.3g} s per step)")
    if spec.dp > 1:
        out.append(f"dp {spec.dp} replicas of the SP group; ZeRO-{t.zero_stage} shards states over all "
                   f"{spec.world} ranks")
    elif spec.world > 1:
        out.append(f"ZeRO-{t.zero_stage} shards states over {spec.world} ranks")
    step = est["throughput"]["step_time_s"]
    for k, undo in (("liger_kernel", False), ("tiled_logits_loss", False), ("activation_checkpointing", False),
                    ("checkpoint_offload", False), ("tiled_mlp", False), ("offload_optimizer", False),
                    ("offload_params", False)):
        if not getattr(t, k):
            continue
        changes: dict[str, Any] = {k: undo}
        if k == "activation_checkpointing":
            changes["checkpoint_offload"] = False
        other = spec.with_(**changes)
        mem_o = memory_section(other, estimate_memory(other))
        saved = mem_o["device_total_gib"] - m["device_total_gib"]
        cost = (step / estimate_throughput(other)["step_time_s"] - 1) * 100
        name = k.replace("_", " ").replace("liger kernel", "Liger")
        if saved <= 0.05:
            saving = "saves no GPU memory here"
        elif k.startswith("offload"):
            saving = f"moves {saved:.1f} GiB per GPU to host memory"
        else:
            saving = f"removes {saved:.1f} GiB of {'logits' if k in FREE_SAVERS else 'activations'} per GPU"
        out.append(f"{name} {saving}; " + (f"costs {cost:.0f}% time" if cost > 0.5 else "no time cost"))
    tp = est["throughput"]
    out.append(f"global batch {tp['sequences_per_step']:,} sequences ({tp['tokens_per_step']:,} tokens) per step: "
               f"micro batch {t.micro_batch_size} x grad_accum {t.grad_accum} x dp {spec.dp}")
    if t.micro_batch_size > 1:
        out.append(f"micro batch {t.micro_batch_size} fills the GEMMs")
    if t.attn_implementation == "flash_attention_3":
        out.append("FlashAttention-3 (Hopper) runs attention faster than FA2; needs the flash-attn 3 build")
    lo, hi = m["headroom_gib_range"]
    plo, phi = m["headroom_pct_range"]
    out.append(f"{m['device_total_gib']:.1f} of {m['gpu_capacity_gib']:.0f} GiB per GPU ({m['verdict']}: "
               f"{lo:.1f} to {hi:.1f} GiB, {plo:.0f}% to {phi:.0f}% headroom); "
               f"{est['throughput']['tokens_per_s']:,.0f} tokens/s")
    return out


def _answer(s: _Search, found: list[Spec], key, liger: bool, train_tokens: int | None = None) -> dict:
    seen, recs = set(), []
    for spec in sorted(found, key=lambda sp: (bool(_missing(sp, s.kernels, liger)), key(sp))):
        k = _key(spec)
        if k in seen:
            continue
        seen.add(k)
        v = validate(at_seq_len(spec.plan, spec.seq_len))
        if v.spec is None:
            continue
        est = estimate_spec(v.spec, v.warnings)
        missing = _missing(v.spec, s.kernels, liger)
        if train_tokens is not None:
            est["cost"] = estimate_cost(v.spec, train_tokens)
        recs.append({"plan": v.spec.plan.effective(), "estimate": est, "reasons": reasons(v.spec, est),
                     "kernels": needed_kernels(v.spec), "missing_kernels": missing,
                     "unavailable": (f"needs {', '.join(missing)}, which no live worker of the plan's queue has "
                                     f"(they have {', '.join(s.kernels or []) or 'none'})") if missing else None})
        if len(recs) == TOP:
            break
    rejected: list[dict] = []
    shown = set()
    for k, why in sorted(((k, why) for k, why in s.rejected.items() if k not in seen and k in s.evaluated),
                         key=lambda kv: _overflow(s, kv[0])):
        spec = s.evaluated[k][2]
        savers = tuple(x for x in SAVERS if getattr(spec.plan.training, x))
        if (spec.sp, spec.zero_stage, savers, why) in shown:
            continue                      # the same miss with another attention kernel
        shown.add((spec.sp, spec.zero_stage, savers, why))
        rejected.append({"plan": spec.plan.effective(), "why": why})
        if len(rejected) == REJECTED:
            break
    rejected += [{"plan": spec.plan.effective(), "why": why} for spec, why in s.batch_misses[:REJECTED]]
    return {"recommendations": recs, "rejected": rejected, "global_batch": s.batch}


def _overflow(s: _Search, key: tuple) -> float:
    if key not in s.evaluated:
        return float("inf")
    _, sec, _ = s.evaluated[key]
    return max(sec["device_total_gib"] - sec["gpu_capacity_gib"],
               sec["cpu_gib_per_node"] - sec["cpu_capacity_gib_per_node"])


def _base(data: Any) -> tuple[Spec | None, dict | None, set[str], int | None]:
    """The spec the search starts from, the errors of a plan no search can fix, the locked fields and the plan's
    global batch (sequences per optimizer step, as the plan states its dp_size; None when it states neither its
    grad_accum nor its dp_size)."""
    raw = data.model_dump(mode="json", exclude_unset=True) if isinstance(data, Plan) else data
    plan, errors = parse(data)
    if plan is None:
        return None, invalid(errors), set(), 0
    v = validate(at_seq_len(plan, plan.training.seq_len))
    if v.spec is None:
        # a rule broken by a field the search sets (sp, dp) is the search's to fix: start from sp = 1
        v1 = validate(at_seq_len(plan.model_copy(update={"parallel": plan.parallel.model_copy(
            update={"sp_size": 1, "dp_size": plan.hardware.gpus_per_node * plan.hardware.num_nodes})}),
            plan.training.seq_len))
        if v1.spec is None:
            return None, invalid(v.errors, v.warnings), set(), 0
        v = v1
    spec = v.spec
    assert spec is not None
    locked = _locked(raw if isinstance(raw, dict) else {})
    if not locked & {"training.grad_accum", "parallel.dp_size"}:
        return spec, None, locked, None
    return spec, None, locked, spec.with_(dp_size=plan.parallel.dp_size).sequences_per_step


def recommend(data: Any, longest: bool = False, kernels: list[str] | None = None, liger: bool = True,
              train_tokens: int | None = None, vary_batch: bool = False, global_batch: int | None = None) -> dict:
    """The configurations that fit, best first (tokens/s; with `longest`, seq_len then tokens/s; with
    `train_tokens`, the wall time to train that many tokens, whole steps, and each estimate's `cost`), and the
    nearest rejected ones with the reason. An invalid plan (a field no search can fix) answers `valid: false` errors.
    `kernels`: the attention kernels the plan's queue can run (its live workers'); an option needing another sorts
    after those that do not, saying so, and a plan that sets one the queue lacks answers an error naming
    training.attn_implementation. `liger` False: no worker of the queue has Liger, so the search does not turn it
    on. The global batch is held at `global_batch` sequences per step (default: the plan's) unless `vary_batch`."""
    base, bad, locked, plan_batch = _base(data)
    if base is None:
        assert bad is not None
        return {"recommendations": [], "rejected": [], "errors": bad["errors"]}
    if kernels is not None and "training.attn_implementation" in locked and base.attn not in kernels:
        return {"recommendations": [], "rejected": [], "queue_kernels": kernels, "errors": [{
            "field": "training.attn_implementation",
            "message": f"{base.attn} is not installed on any worker of the plan's queue (they have "
                       f"{', '.join(kernels) or 'none'})"}]}
    if not liger:
        locked = locked | {"training.liger_kernel"}
    batch = None if vary_batch else (global_batch or plan_batch)
    if batch is not None:
        locked = locked - {"training.grad_accum"}        # the search sets it to hold the batch
    s = _Search(base, locked, "high" if longest else "point", kernels, batch)
    found: list[Spec] = []
    structs = _structures(s)
    if longest:
        for st in structs:
            if st["zero_stage"] != 3 and s.free("zero_stage"):
                continue                         # ZeRO-3 holds the least: the longest context is there
            sw = {**st, **{k: True for k in SAVERS if s.free(k)}}
            if not _valid_switches(sw):
                sw["offload_params"] = False
            spec = s.spec(None, **sw)
            n = max_seq_for_spec(spec, "high")          # the longest that fits at the band's high end
            if n == 0:
                s.rejected[_key(spec)] = "nothing fits, not even sp_size tokens"
                s.evaluate(spec)
                continue
            found.append(_drop_unneeded(s, spec.with_(seq_len=n)))
        return _limited(_answer(s, found, lambda sp: (_verdict(sp) != "fits", -sp.seq_len, -_tps(sp)), liger), kernels)
    fitted_z3: set[tuple] = set()
    for st in structs:
        z3_fits = (st["sp_size"], st["attn_implementation"]) in fitted_z3
        if st["zero_stage"] != 3 and s.free("zero_stage") and not z3_fits:
            continue
        got = _ladder(s, st)
        if got is not None:
            found.append(got)
            if st["zero_stage"] == 3:
                fitted_z3.add((st["sp_size"], st["attn_implementation"]))
    if s.free("micro_batch_size"):
        for spec in sorted(found, key=lambda sp: -_tps(sp))[:3]:
            for mb in MICRO_BATCHES:
                ga = s.grad_accum(spec.dp, mb)
                if ga is None:
                    break
                cand = spec.with_(micro_batch_size=mb, grad_accum=ga)
                ok, sec = s.evaluate(cand)
                if not ok:
                    s.rejected[_key(cand)] = _why(sec)
                    break
                found.append(cand)
    if train_tokens is not None:
        def by_time(sp: Spec) -> tuple:
            steps = math.ceil(train_tokens / sp.tokens_per_step)
            return _verdict(sp) != "fits", steps * estimate_throughput(sp)["step_time_s"]
        return _limited(_answer(s, found, by_time, liger, train_tokens=train_tokens), kernels)
    return _limited(_answer(s, found, lambda sp: (_verdict(sp) != "fits", -_tps(sp)), liger), kernels)


def _limited(answer: dict, kernels: list[str] | None) -> dict:
    """The answer, with the kernels it was limited to (`queue_kernels`) when it was."""
    return answer if kernels is None else {**answer, "queue_kernels": kernels}
