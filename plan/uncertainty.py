"""How sure an estimate is: bands from the validation corpus's residuals, per regime.

The table plan/data/uncertainty_bands.csv is written by `bench/planner_bands.py` from the residuals
log(published / predicted) of bench/data/published_corpus.csv (leave-one-source-out: the band of a regime is the
envelope of the bands each fold builds without one publication, and the bench prints how often the held-out
publication's rows fell inside). This module only reads the table: the planner stays a pure function.

A band (low, high) in log space turns a point x into [x e^low, x e^high]. Memory bands multiply allocated,
reserved and device totals alike; time bands the step time (tokens/s takes the inverse). The short steps' band
(SHORT_STEP_S) adds its high end in seconds instead (`high_form` "add_s": [x e^low, x + high]): what short steps miss
is fixed per-step cost, which adds to a step whatever its length, so a 10 s step is not given the tenfold range a
0.05 s step's fixed cost makes (`time_range`).
"""
from __future__ import annotations

import csv
import math
from functools import lru_cache
from pathlib import Path

BANDS_CSV = Path(__file__).resolve().parent / "data" / "uncertainty_bands.csv"
# A regime with fewer rows or publications than this borrows the pooled band of that kind ("all", see
# bench/planner_bands.py).
MIN_ROWS, MIN_SOURCES = 3, 2
# Step time has a regime of its own for short steps: below this predicted step time the fixed per-step costs (the
# host's work per module and micro batch, launch latency, synchronisation; docs/host-overhead.md) weigh most and are
# modelled least. In the corpus every step predicted at 100 s or more is published within 0.97-1.17x (T9, 1.82x, is
# a ring row), while the steps predicted under 30 s (the ALST paper's 8-27 s rows, the H100 check's 0.03-4 s rows)
# run up to 11x longer: a band built from both would be 11x wide for a 30-minute step. The boundary lies in the
# corpus's gap between 27 s and 50 s predicted steps; bench/planner_bands.py builds the short band from those rows.
SHORT_STEP_S = 30.0


ADD_S = "add_s"  # a band's high end in seconds added to the step (the short steps' fixed costs), not in log space


@lru_cache(maxsize=1)
def table() -> dict[tuple[str, str], tuple[float, float, str]]:
    """(regime, kind) -> (low, high, high_form) as bench/planner_bands.py wrote them."""
    with open(BANDS_CSV, newline="") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#") and line.strip()))
    return {(r["regime"], r["kind"]): (float(r["low"]), float(r["high"]), r.get("high_form") or "log") for r in rows}


def bands() -> dict[tuple[str, str], tuple[float, float]]:
    """The bands in log space (those whose high end is in seconds are left out: see `time_range`)."""
    return {k: (lo, hi) for k, (lo, hi, form) in table().items() if form != ADD_S}


def regime(spec, kind: str, method: str = "ulysses", step_s: float | None = None) -> str:
    """The corpus regime an estimate belongs to: for step time, short when the predicted step (`step_s`) is under
    SHORT_STEP_S; ring for ring/hybrid attention; offload when anything moves to the host; else ulysses
    (Ulysses/DP on DeepSpeed ZeRO). A stated `document_len` is an estimate like any other (the corpus's packed
    rows, of unknown document length, check the bands but do not make them)."""
    if kind == "time" and step_s is not None and step_s < SHORT_STEP_S:
        return "short"
    if method != "ulysses":
        return "ring"
    if spec.offload_optimizer or spec.offload_params or spec.checkpoint_offload:
        return "offload"
    return "ulysses"


def band(spec, kind: str, method: str = "ulysses") -> tuple[float, float]:
    """The memory band (log space) of the estimate's regime; step times take `time_range`."""
    b = bands()
    return b.get((regime(spec, kind, method), kind)) or b[("all", kind)]


def time_range(spec, step_s: float, method: str = "ulysses") -> tuple[float, float]:
    """The range of a predicted step time, in seconds, from its regime's band (short steps: the high end added)."""
    t = table()
    lo, hi, form = t.get((regime(spec, "time", method, step_s), "time")) or t[("all", "time")]
    return step_s * math.exp(lo), (step_s + hi if form == ADD_S else step_s * math.exp(hi))


def scaled(x: float, b: tuple[float, float], nd: int = 3) -> list[float]:
    return [round(x * math.exp(b[0]), nd), round(x * math.exp(b[1]), nd)]

