"""Step-time ranges (plan/uncertainty.py `time_range`): a short step's range adds the short band's fixed seconds to
the step instead of multiplying it, so a 10 s step is not given the tenfold range the H100 check's 0.05 s steps
make; a long step's range stays a factor. bench/planner_bands.py builds the short band leave-one-source-out."""
from __future__ import annotations

import math

from bench.planner_bands import loso_short
from plan import estimate, validate
from plan.uncertainty import ADD_S, SHORT_STEP_S, table, time_range

PLAN = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4},
        "parallel": {"sp_size": 8, "dp_size": 4}, "training": {"seq_len": 131072, "grad_accum": 1}}


def spec():
    s = validate(PLAN).spec
    assert s is not None
    return s


def test_a_short_steps_range_adds_the_fixed_seconds():
    lo, hi, form = table()[("short", "time")]
    assert form == ADD_S
    e = estimate(PLAN)["throughput"]
    step = e["step_time_s"]
    assert step < SHORT_STEP_S
    got = e["step_time_s_range"]
    assert math.isclose(got[1], step + hi, rel_tol=1e-3)
    assert math.isclose(got[0], step * math.exp(lo), rel_tol=1e-3)
    assert got[1] / step < 2  # as a factor of the short band (11x) it was 9-106 s
    tps = e["tokens_per_s"]
    assert math.isclose(e["tokens_per_s_range"][0], tps * step / got[1], rel_tol=1e-3)


def test_a_long_steps_range_is_a_factor():
    lo, hi, form = table()[("all", "time")]
    assert form == "log"
    assert time_range(spec(), 600.0) == (600.0 * math.exp(lo), 600.0 * math.exp(hi))


def test_the_short_band_is_left_one_publication_out_in_seconds():
    # publication a: a 0.05 s step that took 0.5 s (10x, +0.45 s); b: a 10 s step that took 16 s (1.6x, +6 s)
    by_source = {"a": [(math.log(0.5 / 0.05), 0.45)], "b": [(math.log(16 / 10), 6.0), (math.log(9.8 / 10), -0.2)]}
    (lo, hi), coverage = loso_short(by_source)
    assert (round(lo, 4), hi) == (round(math.log(0.98), 4), 6.0)
    # a left out: b's band (0.98x to +6 s) holds a's row (+0.45 s); b left out: a's band (1x to +0.45 s) holds
    # neither of b's (+6 s is past its high end, 0.98x under its low end): 1 of 3 inside
    assert coverage == 1 / 3
