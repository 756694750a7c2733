"""What a run will cost: wall time and GPU-hours to train a token budget (or the run's stages), with a range.

The steps are the budget over the tokens one optimizer step trains (seq_len x micro batch x grad_accum x dp),
rounded up; each step takes the estimate's step time, and the range is the step time's (the corpus band). Only
the training steps count: loading the model, checkpoint saves and evaluations come on top.
"""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from .throughput import estimate_throughput
from .uncertainty import time_range
from .validation import Spec

# The token budget a cost is asked for (API query and recommend body, `ulab plan --train-tokens`): up to a quadrillion.
TrainTokens = Annotated[int, Field(ge=1, le=10**15, description="Tokens to train on: the estimate answers `cost`, "
                                                                 "the wall time and GPU-hours of that many tokens at "
                                                                 "the plan's seq_len")]


def _stages(spec: Spec, train_tokens: int | None) -> list[tuple[Spec, int]] | None:
    """(spec at the stage's seq_len, steps) per stage: the budget at the plan's seq_len, or the run's stages."""
    if train_tokens is not None:
        return [(spec, math.ceil(train_tokens / spec.tokens_per_step))]
    stages = spec.plan.stages()
    if not stages:
        return None
    return [(spec.with_(seq_len=s.seq_len), s.steps) for s in stages]


# (unit, seconds in it, the shortest duration written in it): days from 100 h, hours from 1 h, minutes from 1 min
UNITS = (("d", 86400.0, 100 * 3600.0), ("h", 3600.0, 3600.0), ("min", 60.0, 60.0), ("s", 1.0, 0.0))


def duration_unit(seconds: float) -> str:
    return next(u for u, _, above in UNITS if seconds >= above)


def duration_text(seconds: float, unit: str | None = None) -> str:
    """A duration at a readable unit (`unit`, or its own), two significant digits below 10: 41 h, 7.5 h, 25 min,
    40 s; days from 100 h."""
    unit = unit or duration_unit(seconds)
    x = seconds / next(size for u, size, _ in UNITS if u == unit)
    return f"{x:.2g} {unit}" if x < 10 else f"{x:,.0f} {unit}"


def summary(wall_s: float, wall_range: list[float], gpu_hours: float) -> str:
    """"about 41 h (35-52 h), 1,312 GPU-hours": the estimate and its range in one unit, the range's high end's, so
    they compare at a glance ("about 4.2 d (3.7-7.7 d)", never "about 100 h (88 h to 7.7 d)")."""
    unit = duration_unit(wall_range[1])
    lo, hi = (duration_text(x, unit).split(" ")[0] for x in wall_range)
    hours = f"{gpu_hours:,.0f}" if gpu_hours >= 10 else f"{gpu_hours:.2g}"
    return f"about {duration_text(wall_s, unit)} ({lo}-{hi} {unit}), {hours} GPU-hours"


def estimate_cost(spec: Spec, train_tokens: int | None = None) -> dict | None:
    """The cost section of an estimate: from `train_tokens` at the plan's seq_len, else from the run section's
    stages (their steps and seq_len); None when the plan states neither."""
    stages = _stages(spec, train_tokens)
    if stages is None:
        return None
    wall = sum(n * estimate_throughput(s)["step_time_s"] for s, n in stages)
    mean = wall / sum(n for _, n in stages)
    wall_range = [wall * x / mean for x in time_range(spec, mean)]  # the mean step's range, for every step
    gpus = spec.world
    gpu_hours = wall * gpus / 3600
    tokens = sum(n * s.tokens_per_step for s, n in stages)
    return {"source": "train_tokens" if train_tokens is not None else "run.stages",
            "train_tokens": tokens, "steps": sum(n for _, n in stages), "gpus": gpus,
            "wall_time_s": round(wall, 1), "wall_time_s_range": [round(x, 1) for x in wall_range],
            "gpu_hours": round(gpu_hours, 2), "gpu_hours_range": [round(x * gpus / 3600, 2) for x in wall_range],
            "summary": summary(wall, wall_range, gpu_hours)}
