"""Ulysses vs ring attention vs a Ulysses x ring hybrid for the same plan: memory, communication volume and step
time, and which to use. An estimate only: Ulysses Lab trains with Ulysses (DeepSpeed's UlyssesSPAttentionHF).

- Ulysses (degree P = sp_size): needs num_attention_heads % P == 0 and kv heads that divide P or that P divides
  (replicated up to P). Per layer each rank sends its q, k, v and gets the output back through all-to-alls:
  B t (2 q_dim + 2 kv_dim') (P-1)/P bytes per pass, i.e. O(n d / P) per rank, on the critical path.
- Ring (Accelerate's context parallelism, `cp_size` under FSDP2, torch's ring attention): any head count. Each
  rank keeps all heads for its t = S/P tokens and passes its k, v chunk around the ring: P-1 sequential transfers
  of 2 B kv_dim t bytes per forward (and the recompute), and of k, v plus their fp32 gradients in the backward.
  Each transfer hides behind one block of attention (t x t); what a transfer takes beyond that block is exposed.
  The ring is as slow as its slowest hop: across nodes, the inter-node link. Memory: as an sp = 1 rank holding t
  tokens (no head split, no all-to-all copies), plus two k, v chunks in flight and, in the backward, fp32
  accumulators for dq, dk, dv (torch's _templated_ring_attention_backward accumulates in float32).
  FSDP2 shards parameters, gradients and optimizer states over the world like ZeRO-3.
- Hybrid: Ulysses of degree u inside a node (the largest the heads allow) times a ring of degree r = P / u across
  nodes: the all-to-all stays on NVLink and only r-1 kv transfers cross the network.
"""
from __future__ import annotations

from typing import Any

from .estimator import _r, memory_section, throughput_section
from .memory import GIB, estimate_memory
from .throughput import (
    ATTN_BWD_FACTOR,
    ATTN_EFFICIENCY,
    ATTN_HALF_SEQ,
    LINK_EFFICIENCY,
    attention_len,
    estimate_throughput,
    gpu_class,
)
from .uncertainty import band, scaled, time_range
from .validation import Spec, validate
from .verdict import LABELS, verdict

LABEL = "estimate: Ulysses Lab trains with Ulysses"


def _ulysses_ok(spec: Spec, degree: int) -> str | None:
    m = spec.model
    heads, kv = m.num_attention_heads, m.num_key_value_heads
    if heads % degree:
        return f"num_attention_heads ({heads}) is not divisible by the Ulysses degree ({degree})"
    if kv % degree and degree % kv:
        return f"num_key_value_heads ({kv}) and the Ulysses degree ({degree}) do not divide one another"
    return None


def _a2a_bytes(spec: Spec, degree: int) -> float:
    """Bytes one rank sends in one layer's all-to-alls of one pass (q, k, v in, the output back)."""
    if degree <= 1:
        return 0.0
    m, B, t = spec.model, spec.dtype_bytes, spec.local_tokens
    kv_eff = max(m.num_key_value_heads, degree)
    return B * t * (2 * m.q_dim + 2 * kv_eff * m.head_dim) * (degree - 1) / degree


def _ring(spec: Spec, u: int, r: int) -> dict:
    """Ring of degree r over groups of Ulysses degree u (u = 1: pure ring), as a rank of an sp = u plan over
    S / r tokens, with the attention FLOPs of the whole sequence and the ring's transfers and buffers added."""
    S, world, b = spec.seq_len, spec.world, spec.micro_batch_size
    virtual = spec.with_(sp_size=u, dp_size=world // u, seq_len=S // r)
    m, B, L, g = spec.model, spec.dtype_bytes, spec.model.num_hidden_layers, spec.gpu
    kv_local = max(m.num_key_value_heads, u) // u * m.head_dim       # this rank's kv heads x head_dim
    q_local = m.q_dim // u
    tokens = b * S // r                                               # the tokens of this rank's heads in a block
    chunk = 2 * B * kv_local * tokens                                 # k and v of one ring step
    mem = estimate_memory(virtual)
    sec = memory_section(virtual, mem)
    # the ring's buffers in a layer's backward: two kv chunks in flight and fp32 dq, dk, dv accumulators
    extra = 2 * chunk + 4 * (q_local + 2 * kv_local) * tokens
    phases = mem["activation_phases"]
    at_peak = phases.get(mem["peak_phase"], phases["layer"])
    grow = max(0.0, sum(phases["layer"].values()) + extra - sum(at_peak.values()))
    device_total = sec["device_total_gib"] + grow / GIB
    # Packed documents (`document_len`): attention stops at document boundaries, so each token attends over its
    # document, not the sequence (plan.throughput.attention_len); the ring still passes every kv chunk around.
    attn = attention_len(spec)
    tp = estimate_throughput(virtual, attn_len=attn, attn_block=min(tokens, attn))
    # one ring step computes one t x t block of this rank's heads: the forward's 2 a d S t FLOPs / r per layer
    eta = ATTN_EFFICIENCY[(spec.attn, gpu_class(g))] * tokens / (tokens + ATTN_HALF_SEQ)
    fwd_block = 2 * (m.num_attention_heads // u) * m.head_dim * attn * tokens / r / (g.peak_flops(spec.dtype) * eta)
    across = u * r > spec.ranks_per_node
    bw = (g.typical_internode_gb_per_s if across else g.nvlink_gb_per_s_per_direction) * 1e9 * LINK_EFFICIENCY
    hop = chunk / bw
    hop_bwd = hop * (1 + 4 / B)                                       # k, v and their fp32 gradients
    passes_fwd = 2 if spec.activation_checkpointing else 1            # forward (+ the recompute)
    per_layer = (r - 1) * (passes_fwd * max(0.0, hop - fwd_block) + max(0.0, hop_bwd - ATTN_BWD_FACTOR * fwd_block))
    ring_s = spec.grad_accum * L * per_layer
    volume = spec.grad_accum * L * (r - 1) * chunk * (passes_fwd + 1 + 4 / B)
    volume += spec.grad_accum * L * (passes_fwd + 1) * _a2a_bytes(virtual, u)
    step = tp["step_time_s"] + ring_s
    lo_t, hi_t = time_range(spec, step, "ring")
    n_tokens = S * spec.sequences_per_step
    return {"device_total_gib": _r(device_total), **_bands(spec, device_total, sec["gpu_capacity_gib"], step, "ring"),
            "comm_gb_per_step": _r(volume / 1e9), "exposed_ring_s": ring_s,
            "all_to_all_s": tp["time_breakdown_s"]["all_to_all"], "step_time_s": step,
            "tokens_per_s": n_tokens / step, "tokens_per_s_range": [n_tokens / hi_t, n_tokens / lo_t]}


def _bands(spec: Spec, device_total: float, capacity: float, step: float, method: str) -> dict:
    """The memory and step-time bands of an option (plan.uncertainty) and its verdict."""
    total_range = scaled(device_total, band(spec, "memory", method))
    v = verdict(total_range[0], total_range[1], capacity)
    return {"device_total_gib_range": total_range, "verdict": v, "verdict_label": LABELS[v], "fits": v == "fits",
            "step_time_s_range": list(time_range(spec, step, method))}


def compare(data: Any) -> dict:
    """{"label", "options": [{"method", "degree", "valid", "why_not", memory, comm, step time}], "choice", "why"}."""
    v = validate(data)
    spec = v.spec
    if spec is None and v.plan is not None:
        # Ulysses' head rules may be what the plan breaks; ring attention has none: compare from sp = 1
        plan, world = v.plan, v.plan.hardware.gpus_per_node * v.plan.hardware.num_nodes
        P = plan.parallel.sp_size
        one = validate(plan.model_copy(update={"parallel": plan.parallel.model_copy(
            update={"sp_size": 1, "dp_size": world})}))
        if one.spec is not None and world % P == 0 and plan.training.seq_len % P == 0:
            spec = one.spec.with_(sp_size=P, dp_size=world // P)
    if spec is None:
        return {"label": LABEL, "valid": False, "errors": v.errors, "options": [], "choice": None, "why": ""}
    P, per_node = spec.sp, spec.gpus_per_node
    options: list[dict] = []

    ul_err = _ulysses_ok(spec, P)
    ul: dict[str, Any] = {"method": "ulysses", "degree": P, "ulysses_degree": P, "ring_degree": 1,
                          "valid": ul_err is None, "why_not": ul_err}
    if ul_err is None:
        mem = memory_section(spec, estimate_memory(spec))
        tp = estimate_throughput(spec)
        passes = 3 if spec.activation_checkpointing else 2
        vol = spec.grad_accum * spec.model.num_hidden_layers * passes * _a2a_bytes(spec, P)
        ts = throughput_section(spec, tp)
        ul.update(device_total_gib=mem["device_total_gib"], device_total_gib_range=mem["device_total_gib_range"],
                  verdict=mem["verdict"], fits=mem["fits"], comm_gb_per_step=_r(vol / 1e9),
                  all_to_all_s=tp["time_breakdown_s"]["all_to_all"], exposed_ring_s=0.0,
                  step_time_s=tp["step_time_s"], step_time_s_range=ts["step_time_s_range"],
                  tokens_per_s=tp["tokens_per_s"], tokens_per_s_range=ts["tokens_per_s_range"])
    options.append(ul)
    options.append({"method": "ring", "degree": P, "ulysses_degree": 1, "ring_degree": P, "valid": P > 1,
                    "why_not": None if P > 1 else "sp_size 1: nothing to split",
                    **(_ring(spec, 1, P) if P > 1 else {})})
    u = max((d for d in range(1, min(P, per_node) + 1) if P % d == 0 and _ulysses_ok(spec, d) is None), default=1)
    hybrid_ok = 1 < u < P
    options.append({"method": "hybrid", "degree": P, "ulysses_degree": u, "ring_degree": P // u,
                    "valid": hybrid_ok,
                    "why_not": None if hybrid_ok else ("sp fits inside one node's Ulysses degree: the hybrid is "
                                                       "Ulysses" if u == P else "no Ulysses degree > 1 inside a "
                                                       "node that the heads allow"),
                    **(_ring(spec, u, P // u) if hybrid_ok else {})})
    for o in options:
        for k in ("step_time_s", "tokens_per_s", "all_to_all_s", "exposed_ring_s"):
            if k in o:
                o[k] = float(f"{o[k]:.6g}")
        for k in ("step_time_s_range", "tokens_per_s_range"):
            if k in o:
                o[k] = [float(f"{x:.6g}") for x in o[k]]
    usable = [o for o in options if o["valid"] and o.get("fits")]
    pick = max(usable, key=lambda o: o["tokens_per_s"]) if usable else None
    return {"label": LABEL, "valid": True, "errors": [], "options": options,
            "choice": pick["method"] if pick else None, "why": _why(spec, options, pick)}


def _why(spec: Spec, options: list[dict], pick: dict | None) -> str:
    if pick is None:
        return "none of them fits at this length: see ulab plan --fix"
    by = {o["method"]: o for o in options}
    parts = [f"{pick['method']} is fastest that fits ({pick['tokens_per_s']:,.0f} tokens/s)"]
    ul, ring = by["ulysses"], by["ring"]
    if not ul["valid"]:
        parts.append(f"Ulysses cannot split these heads: {ul['why_not']}")
    elif ring["valid"]:
        where = "inside one NVLink node" if spec.sp <= spec.gpus_per_node else "across nodes"
        parts.append(f"Ulysses moves {ul['comm_gb_per_step']:.3g} GB per step in all-to-alls {where} (O(n d / P) "
                     f"per rank); the ring moves {ring['comm_gb_per_step']:.3g} GB in {spec.sp - 1} sequential "
                     f"transfers per layer, {ring['exposed_ring_s']:.3g} s of them not hidden by attention")
    return "; ".join(parts)
