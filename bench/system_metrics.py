"""Cost of the per-rank system figures (worker/trainer/system.py) that the step callback reads each step.

Times SystemSampler.sample() on this machine: unthrottled (every call reads psutil, and NVML where a GPU is), and as
the trainer uses it (a new sample at most once a second, the previous one reused in between). The cost per step is
printed against step times of 0.1 s to 60 s; the issue's budget is 1% of the step. Without a GPU only the psutil
part is measured: the NVML reads (four per sample) are unmeasured here, and the figures say which was timed.
Prints figures; asserts nothing. Usage: .venv/bin/python bench/system_metrics.py [--calls 2000]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.trainer.system import SystemSampler


def per_call_us(sampler: SystemSampler, calls: int) -> float:
    """Median of 5 rounds of `calls` calls, in microseconds per call."""
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            sampler.sample()
        rounds.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--calls", type=int, default=2000)
    a = p.parse_args()
    try:
        import torch

        cuda = 0 if torch.cuda.is_available() else None
    except ImportError:
        cuda = None
    fresh = SystemSampler(cuda, every_s=0)
    what = "psutil + NVML (GPU 0)" if fresh.nvml else "psutil only (no GPU here: NVML unmeasured)"
    unthrottled = per_call_us(fresh, a.calls)
    throttled = per_call_us(SystemSampler(cuda, every_s=1.0), a.calls)
    print(f"system sample, {what}: {unthrottled:.1f} us per read; reused between reads: {throttled:.2f} us per call")
    print("step time | cost per step | share of the step")
    for step_s in (0.1, 1.0, 10.0, 60.0):
        # steps under every_s (1 s) read once a second and reuse in between: the cost is one read per second
        reads_per_step = min(1.0, step_s / 1.0) if step_s < 1.0 else 1.0
        cost_us = reads_per_step * unthrottled + (1 - reads_per_step) * throttled
        print(f"{step_s:8.1f} s | {cost_us:8.1f} us | {100 * cost_us / (step_s * 1e6):.4f}%")
    worst = unthrottled / 1e6 / 1.0  # one read in a second of training: the largest share at any step time
    print(f"largest share of training time: {100 * worst:.4f}% (budget 1%: {'OK' if worst <= 0.01 else 'MISSED'})")


if __name__ == "__main__":
    main()
