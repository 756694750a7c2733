"""The probe's pure part (plan/probe.py): the probe plans, the depth-line fit, the extrapolated result, the verdict
and the warnings where the line does not hold."""
from __future__ import annotations

import pytest

from plan import validate
from plan.probe import ProbeError, fit_line, probe_config, probe_plan, summarize, text_table
from tests.tiny import tiny_plan


def _plan(layers: int = 8, **training) -> dict:
    p = tiny_plan(sp_size=2, seq_len=256)
    p["model"]["config"]["num_hidden_layers"] = layers
    p["training"].update(training)
    return p


def _depth(d: int, alloc: list[float], step: float, status: str = "ok", reserved: list[float] | None = None) -> dict:
    return {"depth": d, "status": status, "reason": None if status == "ok" else "out of memory on rank 0",
            "ranks": [{"rank": r, "peak_allocated_gib": a, "reserved_gib": reserved[r] if reserved else None,
                       "device_total_gib": None} for r, a in enumerate(alloc)],
            "step_time_s": step, "tokens_per_s": 256 / step if step else None, "loss_finite": True}


def test_fit_line_recovers_slope_and_intercept():
    line = fit_line([1, 2, 4], [3.0 + 0.5 * d for d in (1, 2, 4)])
    assert line["slope"] == pytest.approx(0.5)
    assert line["intercept"] == pytest.approx(3.0)
    assert line["max_residual"] == pytest.approx(0.0, abs=1e-12)
    noisy = fit_line([1, 2, 4], [1.0, 3.0, 4.0])  # least squares, not through the points
    assert noisy["slope"] == pytest.approx(13 / 14)
    assert noisy["max_residual"] > 0.05
    with pytest.raises(ValueError):
        fit_line([2, 2], [1.0, 1.0])


def test_extrapolates_each_rank_and_step_time_to_the_model_depth():
    measured = [_depth(d, [1.0 + 0.25 * d, 1.1 + 0.25 * d], 0.1 + 0.05 * d) for d in (1, 2, 4)]
    r = summarize(_plan(8), measured, "cpu")
    assert r["plan_depth"] == 8
    assert r["depths"] == [1, 2, 4]
    assert r["extrapolated"]["peak_allocated_gib_per_rank"] == pytest.approx([3.0, 3.1])
    assert r["extrapolated"]["peak_allocated_gib"] == pytest.approx(3.1)  # the fullest rank
    assert r["extrapolated"]["step_time_s"] == pytest.approx(0.5)
    assert r["extrapolated"]["tokens_per_s"] == pytest.approx(256 / 0.5)  # seq_len x mbs x gas x dp tokens per step
    assert r["source"] == {"peak_allocated_gib": "extrapolated", "reserved_gib": "not measured",
                           "device_total_gib": "not measured", "step_time_s": "extrapolated",
                           "forward_s": "not measured", "backward_s": "not measured",
                           "optimizer_s": "not measured", "tokens_per_s": "extrapolated"}
    assert r["extrapolated"]["reserved_gib"] is None
    assert r["predicted"]["peak_allocated_gib"] > 0
    assert r["predicted"]["tokens_per_s"] > 0
    assert r["verdict"]["fits"] is True
    assert r["verdict"]["text"].startswith("measured: fits with 77 GiB to spare")
    assert "extrap" in text_table(r)
    assert "planner" in text_table(r)


def test_full_depth_is_measured_not_extrapolated():
    measured = [_depth(d, [1.0 + d, 1.0 + d], 0.1 * d) for d in (1, 2)] + [_depth(8, [9.5, 9.6], 0.9)]
    r = summarize(_plan(8), measured, "cpu")
    assert r["extrapolated"]["peak_allocated_gib"] == pytest.approx(9.6)
    assert r["extrapolated"]["step_time_s"] == pytest.approx(0.9)
    assert r["source"]["peak_allocated_gib"] == "measured"
    assert r["source"]["step_time_s"] == "measured"
    # the line through 1 and 2 layers lands at 9.0 for 8 layers: the check states its error against the measurement
    assert r["check"]["peak_allocated_gib"]["extrapolated"] == [9.0, 9.0]
    assert r["check"]["peak_allocated_gib"]["error"] == pytest.approx([9.0 / 9.5 - 1, 9.0 / 9.6 - 1], abs=1e-4)
    assert r["check"]["step_time_s"]["error"] == pytest.approx(0.8 / 0.9 - 1, abs=1e-4)


def test_an_oom_at_reduced_depth_is_a_result():
    measured = [_depth(1, [70.0, 70.0], 1.0), _depth(2, [0, 0], 0, status="oom"),
                {"depth": 4, "status": "skipped", "reason": "a smaller depth ran out of memory"}]
    r = summarize(_plan(8), measured, "cuda")
    assert r["verdict"] == {"fits": False, "spare_gib": None, "needed_gib": None,
                            "text": "measured: does not fit even at 2 layers"}
    assert any("fewer than two depths" in w for w in r["warnings"])


def test_does_not_fit_when_the_line_passes_the_capacity():
    measured = [_depth(d, [10.0 * d, 10.0 * d], 1.0, reserved=[11.0 * d, 11.0 * d]) for d in (1, 2, 4)]
    r = summarize(_plan(8), measured, "cuda")
    assert r["extrapolated"]["reserved_gib"] == pytest.approx(88.0)
    assert r["verdict"]["fits"] is False
    assert r["verdict"]["text"] == "measured: does not fit, 88 GiB of 80"


def test_warns_where_the_depth_line_does_not_hold():
    # a fixed term (embedding, logits, loss) that is 90% of the 1-layer figure, and a bent step time
    measured = [_depth(d, [9.0 + 0.1 * d, 9.0 + 0.1 * d], [0.1, 0.4, 0.5][i]) for i, d in enumerate((1, 2, 4))]
    r = summarize(_plan(8, zero_stage=3, offload_optimizer=True), measured, "cpu")
    text = "\n".join(r["warnings"])
    assert "peak_allocated_gib: the depth-independent term" in text
    assert "step_time_s: not linear in depth" in text
    assert "offloaded states" in text
    assert "ZeRO-3" in text
    assert "CPU ranks" in text
    # a step time that falls with depth (a loaded machine) is not extrapolated to a negative time
    slower_first = [_depth(d, [1.0 + d, 1.0 + d], [0.9, 0.5, 0.4][i]) for i, d in enumerate((1, 2, 4))]
    r = summarize(_plan(8), slower_first, "cpu")
    assert r["extrapolated"]["step_time_s"] is None
    assert r["extrapolated"]["tokens_per_s"] is None
    assert r["source"]["step_time_s"] == r["source"]["tokens_per_s"] == "not extrapolated: falls with depth"
    assert any("step_time_s: falls with depth" in w for w in r["warnings"])
    clean = summarize(_plan(8), [_depth(d, [1.0 + d, 1.0 + d], 0.1 * d) for d in (1, 2, 4)], "cuda")
    assert not any("not linear" in w or "depth-independent" in w for w in clean["warnings"])


def test_probe_plan_keeps_the_layout_and_shapes_at_reduced_depth():
    p = _plan(8, zero_stage=3, tiled_mlp=True)
    p["model"]["config"]["layer_types"] = ["full_attention"] * 8
    p["run"] = {"steps": 500, "data": {"path": "/data/real.jsonl"}, "model_path": "/weights", "checkpoint_every": 50,
                "learning_rate": 3e-4}
    out = probe_plan(p, 2, 4, "/tmp/probe.txt", cuda=False)
    assert out["model"]["config"]["num_hidden_layers"] == 2
    assert out["model"]["config"]["layer_types"] == ["full_attention"] * 2
    assert out["model"]["config"]["hidden_size"] == 64
    assert out["parallel"] == {"sp_size": 2, "dp_size": 1}
    assert out["training"]["zero_stage"] == 3
    assert out["training"]["tiled_mlp"] is True
    assert out["run"]["steps"] == 4
    assert out["run"]["checkpoint_every"] == 0
    assert "model_path" not in out["run"]
    assert out["run"]["data"] == {"path": "/tmp/probe.txt"}
    assert out["run"]["learning_rate"] == 3e-4
    assert validate(out).valid


def test_probe_config_of_a_preset_has_its_shapes():
    p = {"model": {"preset": "Qwen/Qwen3-4B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 1},
         "training": {"seq_len": 4096}}
    spec = validate(p).spec
    cfg = probe_config(spec, 2)
    assert cfg["model_type"] == "qwen3"
    assert cfg["num_hidden_layers"] == 2
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["head_dim"]) == (2560, 9728,
                                                                                                 151936, 128)
    assert validate(probe_plan(p, 2, 3, "x.txt", cuda=True)).valid


def test_an_invalid_plan_names_its_field():
    p = _plan(8)
    p["training"]["zero_stage"] = 7
    with pytest.raises(ProbeError, match=r"^training\.zero_stage: "):
        probe_plan(p, 1, 3, "x.txt", cuda=False)


def test_the_step_breakdown_is_extrapolated_per_part_and_shown_in_text():
    measured = [_depth(d, [1.0 + 0.25 * d, 1.1 + 0.25 * d], 0.1 + 0.06 * d) for d in (1, 2, 4)]
    for m in measured:
        d = m["depth"]
        m["breakdown_s"] = {"forward_s": 0.01 + 0.01 * d, "backward_s": 0.02 + 0.02 * d, "optimizer_s": 0.005 * d}
    r = summarize(_plan(8), measured, "cpu")
    parts = r["extrapolated"]["breakdown_s"]
    assert parts == {"forward_s": pytest.approx(0.09), "backward_s": pytest.approx(0.18),
                     "optimizer_s": pytest.approx(0.04)}
    assert r["source"]["forward_s"] == r["source"]["optimizer_s"] == "extrapolated"
    assert "0.090/0.180/0.040" in text_table(r)
    assert "fwd/bwd/opt s" in text_table(r)


def test_without_the_breakdown_in_the_records_it_is_not_measured():
    measured = [_depth(d, [1.0 + 0.25 * d, 1.1 + 0.25 * d], 0.1 + 0.05 * d) for d in (1, 2, 4)]
    for m in measured:
        m["breakdown_s"] = None  # what worker/probe.py reads from a trainer that does not time the parts
    r = summarize(_plan(8), measured, "cpu")
    assert r["extrapolated"]["breakdown_s"] is None
    assert [r["source"][p] for p in ("forward_s", "backward_s", "optimizer_s")] == ["not measured"] * 3
    assert r["extrapolated"]["step_time_s"] == pytest.approx(0.5)
    assert text_table(r).count("not measured") >= 4  # three depths and the extrapolated line
