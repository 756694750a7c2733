"""Planner speed, in-process: one estimate (target median <= 2 ms; with a token budget's cost too) and a
max-context search (target <= 50 ms).

    .venv/bin/python bench/planner_speed.py [--repeat N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plan import estimate, max_seq_len, sweep
from tests.plans import alst_plan, qwen_plan

PLAN = qwen_plan(seq_len=65536)
ALST = alst_plan(8, 4, seq_len=4194304)


def timeit(fn, repeat: int) -> list[float]:
    fn()  # warm caches (CSV catalog)
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def report(name: str, ms: list[float], target: float | None) -> None:
    med = statistics.median(ms)
    p95 = sorted(ms)[int(0.95 * (len(ms) - 1))]
    verdict = "" if target is None else (f"  target <= {target:g} ms: {'OK' if med <= target else 'MISSED'}")
    print(f"{name:<42} median {med:8.3f} ms   p95 {p95:8.3f} ms   n={len(ms)}{verdict}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    report("estimate (Qwen3-4B, sp4, 64K)", timeit(lambda: estimate(PLAN), args.repeat), 2)
    report("estimate (Llama-8B, 32 GPUs, 4M, ALST)", timeit(lambda: estimate(ALST), args.repeat), 2)
    report("estimate + cost of 2e10 tokens (Qwen3-4B)", timeit(lambda: estimate(PLAN, 20_000_000_000),
                                                                args.repeat), 2)
    r = max_seq_len(PLAN)
    report(f"max-context search (Qwen3-4B -> {r['max_seq_len']})",
           timeit(lambda: max_seq_len(PLAN), args.repeat // 4), 50)
    r = max_seq_len(ALST)
    report(f"max-context search (ALST 32 GPUs -> {r['max_seq_len']})",
           timeit(lambda: max_seq_len(ALST), args.repeat // 4), 50)
    report("sweep (defaults: sp x log-spaced seq grid)", timeit(lambda: sweep(PLAN, None, None), 10), None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
