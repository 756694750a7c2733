"""A plan-v1 Estimate as a few lines of text for the terminal (`ulab plan --text`). Formatting only: every figure
comes from the Estimate as it is, so the text and the JSON never disagree."""
from __future__ import annotations

from .validation import Spec, validate


def _si(x: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.1f}{suffix}"
    return f"{x:.0f}"


def _seconds(s: float) -> str:
    """A duration people read: "450 us", "10.7 s", "16 min 26 s", "5 h 3 min"."""
    if s < 1e-3:
        return f"{s * 1e6:.3g} \u00b5s"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{int(s // 60)} min {round(s % 60)} s"
    return f"{int(s // 3600)} h {round(s % 3600 / 60)} min"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def _parts(d: dict, unit: str, fmt: str) -> str:
    """The non-zero entries of a breakdown, largest first (`name 1.23 GiB, ...`)."""
    items = sorted(((k, v) for k, v in d.items() if v), key=lambda kv: -kv[1])
    return ", ".join(f"{k.replace('_', ' ')} {v:{fmt}}{unit}" for k, v in items) or "none"


def _setup(spec: Spec) -> str:
    """The configuration as the estimate read it (defaults filled in by validation)."""
    offload = [name for on, name in ((spec.offload_optimizer, "optimizer"), (spec.offload_params, "params"),
                                     (spec.checkpoint_offload, "checkpoints")) if on]
    savers = [name for on, name in ((spec.activation_checkpointing, "activation checkpointing"),
                                    (spec.tiled_mlp, "tiled MLP"), (spec.tiled_logits_loss, "tiled logits loss")) if on]
    nodes = spec.num_nodes
    return (f"{spec.gpus_per_node} x {spec.gpu.name} per node x {nodes} node{'s' if nodes != 1 else ''}, "
            f"sp {spec.sp} x dp {spec.dp}, seq_len {spec.seq_len:,}, {spec.dtype}, ZeRO-{spec.zero_stage}"
            + (f", offloaded: {', '.join(offload)}" if offload else "") + (f", {', '.join(savers)}" if savers else ""))


def text_report(plan: dict, estimate: dict, max_seq: int | None = None, likely: int | None = None) -> str:
    """The Estimate `estimate` of `plan` (with `max_seq`: the answer of a max-context search, the length whose
    memory range fits; `likely` the length whose point estimate fits) as text."""
    lines = []
    if not estimate.get("valid"):
        lines.append("not a valid plan:")
        lines += [f"  {e['field']}: {e['message']}" for e in estimate.get("errors", [])]
    else:
        spec = validate(plan).spec
        assert spec is not None  # the estimate is valid
        if max_seq is not None:  # the estimate is at the length the search found (sp_size when nothing fits)
            spec = spec.with_(seq_len=max(max_seq, spec.sp))
        lines.append(f"{spec.model.name} ({_count(spec.model.total_params)} params): {_setup(spec)}")
        if max_seq is not None:
            lines.append(f"longest seq_len that fits: {max_seq:,} tokens (the range's high end fits)"
                         + (f", {likely:,} likely (the point estimate fits)" if likely is not None else "")
                         + (" (nothing fits)" if max_seq == 0 else "; the estimate below is at the first length"))
        m, t = estimate["memory"], estimate["throughput"]
        lines.append(f"GPU memory per rank: {m['peak_allocated_gib']:.2f} GiB allocated at its peak "
                     f"({m.get('peak_phase', '?')}), {m['device_total_gib']:.2f} GiB device total of "
                     f"{m['gpu_capacity_gib']:.0f} GiB")
        lines.append(f"  {m['verdict_text']} (range {m['device_total_gib_range'][0]:.1f}\u2013"
                     f"{m['device_total_gib_range'][1]:.1f} GiB)")
        lines.append(f"  {_parts(m['breakdown_gib'], ' GiB', '.3g')}")
        if m.get("reserved_gib") is not None:
            lines.append(f"  device total = allocator reserved {m['reserved_gib']:.2f} GiB (of which "
                         f"{m['allocator_stranded_gib']:.2f} stranded by a split transient block) + CUDA context and "
                         f"NCCL {m['context_and_nccl_gib']:.2f} GiB")
        lines.append(f"CPU memory per node: {m['cpu_gib_per_node']:.1f} GiB of {m['cpu_capacity_gib_per_node']:.0f} "
                     f"GiB: {'fits' if m['cpu_fits'] else 'DOES NOT FIT'}")
        if m.get("cpu_breakdown_gib_per_node"):
            lines.append(f"  {_parts(m['cpu_breakdown_gib_per_node'], ' GiB', '.1f')}")
        lines.append(f"step (one optimizer step): {t['step_time_s']:.4g} s; {_si(t['tokens_per_s'])} tokens/s "
                     f"({_si(t['tokens_per_s_per_gpu'])} per GPU), {t['tflops_per_gpu']:.1f} TFLOPS per GPU, "
                     f"MFU {100 * t['mfu']:.1f}%")
        lo, hi = t["step_time_s_range"]
        tlo, thi = t["tokens_per_s_range"]
        lines.append(f"  range: {lo:.4g}\u2013{hi:.4g} s per step, {_si(tlo)}\u2013{_si(thi)} tokens/s")
        lines.append(f"  {_parts(t['time_breakdown_s'], ' s', '.4g')}")
        if estimate.get("cost"):
            lines.append(cost_line(estimate["cost"]))
    lines += [f"warning: {w['field']}: {w['message']}" for w in estimate.get("warnings", [])]
    return "\n".join(lines)


def cost_line(cost: dict) -> str:
    """`run cost: about 41 h (35-52 h), 1,312 GPU-hours (2.0B tokens, 30,518 steps on 32 GPUs)`."""
    return (f"run cost: {cost['summary']} ({_count(cost['train_tokens'])} tokens, {cost['steps']:,} steps on "
            f"{cost['gpus']} GPUs; training steps only)")


def recommend_report(answer: dict) -> str:
    """`ulab plan --recommend --text`: the fitting configurations best first, each with its verdict, speed and the
    reasons for its choices, then the nearest rejected ones with why (the JSON's `recommendations`, `rejected`)."""
    if answer.get("errors"):
        return "\n".join(["not a valid plan:"] + [f"  {e['field']}: {e['message']}" for e in answer["errors"]])
    found, lines = answer.get("recommendations", []), []
    lines.append(f"{len(found)} configuration{'s' if len(found) != 1 else ''} fit{'s' if len(found) == 1 else ''}"
                 + (", best first:" if found else ""))
    for i, rec in enumerate(found, start=1):
        spec = validate(rec["plan"]).spec
        m, t = rec["estimate"]["memory"], rec["estimate"]["throughput"]
        setup = f"{_setup(spec)}, micro batch {spec.plan.training.micro_batch_size}, {spec.attn}" if spec else "?"
        lines.append(f"{i}. {setup}")
        lines.append(f"   {m['verdict_text']}; {_si(t['tokens_per_s'])} tokens/s ({_si(t['tokens_per_s_per_gpu'])} "
                     f"per GPU), MFU {100 * t['mfu']:.1f}%")
        lo, hi = t["step_time_s_range"]
        blo, bhi = t["time_per_billion_tokens_s_range"]
        lines.append(f"   step {_seconds(t['step_time_s'])} ({_seconds(lo)}\u2013{_seconds(hi)}) for "
                     f"{_si(t['tokens_per_step'])} tokens ({t['sequences_per_step']:,} sequences); "
                     f"{_seconds(t['time_per_billion_tokens_s'])} per billion tokens ({_seconds(blo)}\u2013"
                     f"{_seconds(bhi)}); needs {', '.join(rec['kernels'])}")
        if rec.get("unavailable"):
            lines.append(f"   ! {rec['unavailable']}")
        if rec["estimate"].get("cost"):
            lines.append(f"   {cost_line(rec['estimate']['cost'])}")
        lines += [f"   - {r}" for r in rec.get("reasons", [])]
    if answer.get("rejected"):
        lines.append("nearest rejected:")
        for rej in answer["rejected"]:
            spec = validate(rej["plan"]).spec
            lines.append(f"  {_setup(spec) if spec is not None else '?'}: {rej['why']}")
    return "\n".join(lines)


def _short(n: float, units: tuple[tuple[float, str], ...]) -> str:
    for div, suffix in units:
        if n >= div and n % div == 0:
            return f"{n / div:.0f}{suffix}"
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:g}"


def default_run_name(plan: dict) -> str:
    """What an unnamed run is called: the model (its preset's own name, else the config's model type and size),
    the layout and the context, e.g. "llama-3.1-8b sp8 128K", "llama-140K sp2 dp2 512"."""
    v = validate(plan)
    spec = v.spec
    if spec is None:
        return "unnamed"
    preset = (plan.get("model") or {}).get("preset")
    if preset:
        model = str(preset).rsplit("/", 1)[-1].lower()
    else:
        kind = ((plan.get("model") or {}).get("config") or {}).get("model_type") or "model"
        model = f"{kind}-{_short(spec.model.total_params, ((1e9, 'B'), (1e6, 'M'), (1e3, 'K')))}"
    layout = f"sp{spec.sp}" + (f" dp{spec.dp}" if spec.dp > 1 else "") + (
        f" {spec.num_nodes} nodes" if spec.num_nodes > 1 else "")
    seq = _short(spec.seq_len, ((1 << 20, "M"), (1 << 10, "K"))) if spec.seq_len % 1024 == 0 else f"{spec.seq_len}"
    return f"{model} {layout} {seq}"
