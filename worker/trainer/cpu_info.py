"""py-cpuinfo's answer, asked once per launch instead of three times per rank.

With the optimizer offloaded, DeepSpeed asks py-cpuinfo's `get_cpu_info()` which CPU it runs on three times each
time CPU Adam starts: `cpu_arch()` and `simd_width()` in op_builder/builder.py (the extension's compile flags, also
when the built library is only loaded) and `DeepSpeedCPUAdam.__init__` (its AMD-and-bf16 warning). Each call starts
a Python subprocess (`cpuinfo.py --json`, ~1.1 CPU-s on the test machine), so the launcher, which builds the op
before the ranks start, paid ~2.2 CPU-s and every rank ~3.3 before its first step.

`share_cpu_info()` asks once, in the launcher, and hands the answer to the processes it starts (torchrun and the
ranks of this node) through the environment; in each process `cpuinfo.get_cpu_info` then returns that answer.
DeepSpeed imports the function inside its methods, so the replacement is what they call. An empty or failed answer is
not kept: DeepSpeed then asks (and falls back to lscpu) as it would have.
"""
from __future__ import annotations

import json
import os
from typing import Any

CPU_INFO_ENV = "ULAB_CPU_INFO"


def share_cpu_info() -> dict[str, Any] | None:
    """Make `cpuinfo.get_cpu_info()` answer from one reading: the environment's (set by the launcher) or, first,
    this process's own, which it then puts in the environment for its children. Returns the reading (None where
    py-cpuinfo is missing or gave nothing)."""
    try:
        import cpuinfo
    except ImportError:
        return None
    info: dict[str, Any] | None = None
    if os.environ.get(CPU_INFO_ENV):
        try:
            info = json.loads(os.environ[CPU_INFO_ENV])
        except ValueError:
            info = None
    if not info:
        try:
            info = cpuinfo.get_cpu_info()
        except Exception:  # DeepSpeed catches this and reads lscpu: leave that path to it
            return None
        if not info:
            return None
        os.environ[CPU_INFO_ENV] = json.dumps(info)
    reading = info
    cpuinfo.get_cpu_info = lambda: dict(reading)
    return reading
