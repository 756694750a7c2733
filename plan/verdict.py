"""The memory verdict of a plan, in one place: the word (`fits`, `tight`, `does_not_fit`), its label and its sentence.

Every reader of an estimate (the planner page, the import panel, Recommend, the run page, `ulab plan --text`) shows
the `verdict`, `verdict_label` and `verdict_text` the estimate carries (plan.estimator.memory_section); none words
it again.
"""
from __future__ import annotations

DASH = "\u2013"
LABELS = {"fits": "fits", "tight": "may not fit", "does_not_fit": "does not fit"}


def verdict(low: float, high: float, capacity: float) -> str:
    """fits: the band's high end fits; tight: only its low end does; does_not_fit: not even the low end."""
    if high <= capacity:
        return "fits"
    return "tight" if low <= capacity else "does_not_fit"


def _gib(x: float, scale: float | None = None) -> str:
    """GiB at the precision a verdict needs: whole GiB when `scale` (default: x) is 10 or more, one decimal below
    (a tiny model's 0.4 GiB)."""
    return f"{x:,.0f}" if abs(x if scale is None else scale) >= 10 else f"{x:.1f}"


def _span(low: float, high: float) -> str:
    """"9-17" (both ends at one precision), or "79" when both read the same."""
    scale = max(abs(low), abs(high))
    a, b = _gib(low, scale), _gib(high, scale)
    return a if a == b else f"{a}{DASH}{b}"


def verdict_text(low: float, high: float, capacity: float) -> str:
    """The verdict of the device-total band [low, high] on a `capacity` GiB card as one sentence:
    "fits with 9-17 GiB to spare", "may not fit: 74-86 GiB of 80", "does not fit: 92-104 GiB of 80"."""
    v = verdict(low, high, capacity)
    if v == "fits":
        return f"fits with {_span(capacity - high, capacity - low)} GiB to spare"
    return f"{LABELS[v]}: {_span(low, high)} GiB of {_gib(capacity)}"


def verdict_fields(low: float, high: float, capacity: float, cpu_gib: float, cpu_capacity: float) -> dict:
    """The verdict fields of an Estimate's memory section (plan.results.MemoryEstimate). `verdict_text` names the
    host memory too when it does not fit, so a plan whose GPUs fit but whose nodes do not never reads "fits"."""
    v = verdict(low, high, capacity)
    cpu_fits = cpu_gib <= cpu_capacity
    host = f"; host memory does not fit: {_gib(cpu_gib)} of {_gib(cpu_capacity)} GiB per node"
    text = verdict_text(low, high, capacity) + ("" if cpu_fits else host)
    label = LABELS[v] if cpu_fits else LABELS["does_not_fit"]
    return {"fits": v == "fits", "verdict": v, "verdict_label": label, "verdict_text": text}
