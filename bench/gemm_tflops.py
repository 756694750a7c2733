"""Dense GEMM TFLOPS at the ~1B Llama's shapes, sustained: what the device's matmuls give at the trainer's sizes
while its clocks and power settle (the window samples both at 1 Hz meanwhile).

The forward GEMMs of one layer and the head, over the 16,384 tokens of one 16K row, as Transformers' Llama runs
them (one nn.Linear each; `F.linear(x, W)` with W [out, in]): q, k, v, o, gate, up, down and lm_head. They run
round-robin for --seconds (10 on CUDA); each shape's TFLOPS is its FLOPs (2 x M x N x K per call) over the device
time of its calls (CUDA events), and the whole run's TFLOPS is printed per second of the run too, so a clock that
drops under sustained load shows. CPU (make gpu-rehearsal): the tiny model's shapes at 512 tokens, fp32, 1 s.

Usage: python bench/gemm_tflops.py [--cpu] [--seconds S] [--json OUT]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernel_bench import Bench, write_json


def shapes(config: dict) -> dict[str, tuple[int, int]]:
    """name -> (in, out) of the layer's and the head's linear layers (transformers/models/llama/modeling_llama.py)."""
    h, i, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
    return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h), "gate_proj": (h, i),
            "up_proj": (h, i), "down_proj": (i, h), "lm_head": (h, v)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--seconds", type=float, default=None, help="sustained for (default 10 on CUDA, 1 on CPU)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    b = Bench(a.cpu)
    t = b.torch
    seconds = a.seconds if a.seconds is not None else (10.0 if b.cuda else 1.0)
    m = b.seq_len
    g = t.Generator(device=b.device).manual_seed(0)
    inputs = {k for k, _ in shapes(b.config).values()}
    x = {k: t.randn(m, k, device=b.device, dtype=b.dtype, generator=g) for k in inputs}
    w = {name: t.randn(n, k, device=b.device, dtype=b.dtype, generator=g) / k ** 0.5
         for name, (k, n) in shapes(b.config).items()}
    flops = {name: 2 * m * n * k for name, (k, n) in shapes(b.config).items()}
    for name, (k, _) in shapes(b.config).items():  # warm-up: each shape's kernel chosen and loaded
        t.nn.functional.linear(x[k], w[name])
    b.sync()
    busy = dict.fromkeys(w, 0.0)
    done = dict.fromkeys(w, 0)
    per_second: list[dict] = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        second_flops, t_sec = 0.0, time.perf_counter()
        while time.perf_counter() - t_sec < 1.0 and time.perf_counter() - start < seconds:
            for name, (k, _) in shapes(b.config).items():
                if b.cuda:
                    e0, e1 = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
                    e0.record()
                    t.nn.functional.linear(x[k], w[name])
                    e1.record()
                    e1.synchronize()
                    busy[name] += e0.elapsed_time(e1) / 1000
                else:
                    busy[name] += b.once(lambda k=k, name=name: t.nn.functional.linear(x[k], w[name]))
                done[name] += 1
                second_flops += flops[name]
        per_second.append({"t_s": round(time.perf_counter() - start, 2),
                           "tflops": float(f"{second_flops / (time.perf_counter() - t_sec) / 1e12:.4g}")})
    peak = b.peak_flops()
    out = {**b.header(), "tokens": m, "seconds": round(time.perf_counter() - start, 2),
           "peak_tflops": peak and peak / 1e12,
           "shapes": {name: {"in": k, "out": n, "calls": done[name],
                             "tflops": float(f"{done[name] * flops[name] / busy[name] / 1e12:.4g}"),
                             "of_peak": peak and round(done[name] * flops[name] / busy[name] / peak, 3)}
                      for name, (k, n) in shapes(b.config).items()},
           "per_second_wall_tflops": per_second}
    write_json(a.json, out)


if __name__ == "__main__":
    main()
