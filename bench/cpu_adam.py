"""DeepSpeedCPUAdam throughput per CPU core, measured here (the planner's CPU optimizer step under offload).

    .venv/bin/python bench/cpu_adam.py [--params 50e6] [--threads 1,2] [--repeat 5]

Steps an fp32 partition of `--params` parameters (fp32 master weights, momentum, variance and an fp32 gradient, as
ZeRO-Offload hands DeepSpeedCPUAdam) with 1..N torch threads (DeepSpeed's CPU Adam parallelises its loop with
OpenMP over torch's intra-op threads) and prints parameters per second, in total and per core. The step is bound by
memory bandwidth (about 16 bytes read and 12 written per parameter, plus the bf16 copy back), so per-core rates
only scale while the memory channels keep up: the planner (plan/throughput.py CPU_ADAM_PARAMS_PER_S_PER_CORE) turns
the single-core rate into bytes per second, multiplies it by the cores a rank gets (one under torchrun's
OMP_NUM_THREADS=1 unless the plan states hardware.cpu_cores_per_node) and caps it by the node's memory bandwidth.
The first call JIT-builds the op (cached in ~/.cache/torch_extensions).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def _cached_op():
    """The JIT-built op from torch's extension cache, imported as is (no rebuild, no build lock); None if absent."""
    import importlib.util
    from pathlib import Path

    from torch.utils.cpp_extension import _get_build_directory

    so = Path(_get_build_directory("cpu_adam", verbose=False)) / "cpu_adam.so"
    if not so.exists():
        return None
    spec = importlib.util.spec_from_file_location("cpu_adam", so)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(n: int, threads: int, repeat: int) -> float:
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import CPUAdamBuilder

    op = _cached_op()
    if op is not None:
        CPUAdamBuilder.load = lambda self, verbose=True: op     # type: ignore[method-assign]

    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n, dtype=torch.float32))
    p.grad = torch.randn(n, dtype=torch.float32)
    opt = DeepSpeedCPUAdam([p], lr=1e-4, adamw_mode=True)
    opt.step()                                  # the first step allocates momentum and variance
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=50e6)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = int(args.params)
    print(f"DeepSpeedCPUAdam, fp32 partition of {n / 1e6:.0f}M parameters, median of {args.repeat} steps")
    for t in (int(x) for x in args.threads.split(",")):
        rate = measure(n, t, args.repeat)
        print(f"threads {t}: {rate / 1e6:8.1f} M params/s total, {rate / t / 1e6:8.1f} M params/s per core")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
