"""The ~1B Llama trained by a plain PyTorch loop: no Trainer, no DeepSpeed, no Accelerate, no packed-document
attention, no callbacks. What the device gives this model at 16K tokens when nothing of the stack stands between:
the ceiling the trainer's rows are read against.

Transformers' LlamaForCausalLM from the config (random weights, seed 0, bf16 weights and fused AdamW states:
`torch.optim.AdamW(fused=True)`), sdpa attention, non-reentrant activation checkpointing on every layer, one row of
--seq-len random tokens (one document, so one causal attention call per layer), Transformers' own loss. --steps
timed steps (each waits for the device), then one more under torch.profiler:
- gpu_busy_over_wall: the union of the device's kernel, memcpy and memset intervals over the step's wall time;
- syncs: the CUDA runtime's synchronize calls (device, stream, event), and `aten::_local_scalar_dense` (every
  `.item()`, `bool(tensor)`, `.tolist()` of a device tensor ends in it);
- memcpy: device-side copies and the runtime's cudaMemcpy* calls.
MFU divides the planner's model FLOPs per token (plan/catalog.py flops_per_token: no recompute, the trainer's MFU
counts the same) by the catalog's bf16 peak. CPU (make gpu-rehearsal): the tiny model at 512 tokens, fp32,
CPU-only profile; the device figures read "skipped: no CUDA".

Usage: python bench/plain_loop.py [--cpu] [--seq-len N] [--steps 4] [--json OUT]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_bench import Bench, model_spec, write_json

NO_CUDA = "skipped: no CUDA"
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


def busy_union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (overlapping kernels of several streams count once)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def profile_figures(events, wall_s: float, cuda: bool) -> dict:
    from torch.autograd import DeviceType

    names = [e.name for e in events]
    out: dict = {"wall_s": round(wall_s, 4), "item_calls": names.count("aten::_local_scalar_dense")}
    if not cuda:
        return {**out, "gpu_busy_s": NO_CUDA, "gpu_busy_over_wall": NO_CUDA, "syncs": NO_CUDA, "memcpy": NO_CUDA}
    device = [e for e in events if e.device_type == DeviceType.CUDA]
    busy = busy_union([(e.time_range.start, e.time_range.end) for e in device]) / 1e6  # profiler times are in us
    out.update(gpu_busy_s=round(busy, 4), gpu_busy_over_wall=round(busy / wall_s, 3),
               syncs={s: names.count(s) for s in SYNCS},
               memcpy={"device": sum("memcpy" in e.name.lower() for e in device),
                       "runtime_calls": sum(n.startswith("cudaMemcpy") for n in names)})
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--seq-len", type=int, default=None, help="default 16384 on CUDA, 512 on CPU")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    b = Bench(a.cpu)
    t = b.torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoConfig, AutoModelForCausalLM

    s = a.seq_len or b.seq_len
    cfg = dict(b.config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    t.manual_seed(0)
    t_build = time.perf_counter()
    with b.device:
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=b.dtype)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    optimizer = t.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    build_s = time.perf_counter() - t_build
    ids = t.randint(0, config.vocab_size, (1, s), device=b.device, generator=t.Generator(b.device).manual_seed(0))

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    losses, times = [], []
    for _ in range(a.steps):
        b.sync()
        t0 = time.perf_counter()
        losses.append(step().detach())
        b.sync()
        times.append(time.perf_counter() - t0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if b.cuda else [])
    with profile(activities=activities) as prof:
        b.sync()
        t0 = time.perf_counter()
        losses.append(step().detach())
        b.sync()
        profiled_s = time.perf_counter() - t0
    spec = model_spec(b.config)
    flops = spec.flops_per_token(s) * s
    peak = b.peak_flops()
    later = sorted(times[1:] or times)
    median = later[len(later) // 2]
    out = {**b.header(), "seq_len": s, "params": spec.total_params, "build_s": round(build_s, 2),
           "step_times_s": [round(x, 4) for x in times], "median_step_s_after_first": round(median, 4),
           "model_tflops": float(f"{flops / median / 1e12:.4g}"),
           "mfu": round(flops / median / peak, 4) if peak else NO_CUDA,
           "peak_allocated_gib": round(t.cuda.max_memory_allocated() / 2**30, 2) if b.cuda else NO_CUDA,
           "losses": [round(float(x), 5) for x in losses],
           "profiled_step": profile_figures(prof.events(), profiled_s, b.cuda)}
    write_json(a.json, out)


if __name__ == "__main__":
    main()
