"""Max-context search, sweeps and exports."""
import copy
import json

import pytest

from plan import estimate, exports, max_seq_len, sweep
from tests.plans import QWEN3_4B_SP4

BASE = QWEN3_4B_SP4


def with_training(**kw):
    p = copy.deepcopy(BASE)
    p["training"].update(kw)
    return p


@pytest.mark.parametrize("changes", [{}, {"tiled_logits_loss": True, "tiled_mlp": True, "checkpoint_offload": True}])
def test_max_seq_is_the_boundary(changes):
    # `safe` (= max_seq_len) is where memory.fits stops (the band's high end), `likely` where the point estimate does.
    r = max_seq_len(with_training(**changes))
    n, safe = r["likely"], r["safe"]
    assert r["max_seq_len"] == safe
    assert isinstance(n, int)
    assert n > 0
    assert n % 4 == 0
    assert 0 < safe < n <= r["optimistic"]
    assert safe % 4 == 0
    assert estimate(with_training(seq_len=safe, **changes))["memory"]["fits"]
    assert not estimate(with_training(seq_len=safe + 4, **changes))["memory"]["fits"]
    assert r["estimate"]["memory"]["fits"]  # the estimate is at max_seq_len

    def point_fits(seq):
        m = estimate(with_training(seq_len=seq, **changes))["memory"]
        return m["device_total_gib"] <= m["gpu_capacity_gib"]
    assert point_fits(n)
    assert not point_fits(n + 4)
    assert estimate(with_training(seq_len=safe, **changes))["memory"]["verdict"] == "fits"
    assert estimate(with_training(seq_len=safe + 4, **changes))["memory"]["verdict"] == "tight"


def test_tiling_and_offload_extend_the_context():
    plain = max_seq_len(BASE)["max_seq_len"]
    alst = max_seq_len(with_training(tiled_logits_loss=True, tiled_mlp=True, checkpoint_offload=True))["max_seq_len"]
    assert alst > 4 * plain


def test_max_seq_limited_by_cpu_memory():
    p = with_training(checkpoint_offload=True, tiled_logits_loss=True, tiled_mlp=True)
    p["hardware"]["cpu_memory_gib_per_node"] = 200
    r = max_seq_len(p)
    assert r["estimate"]["memory"]["cpu_fits"] is True
    q = copy.deepcopy(p)
    q["training"]["seq_len"] = r["max_seq_len"] + 4
    over = estimate(q)["memory"]
    assert over["cpu_fits"] is False or over["fits"] is False


def test_max_seq_of_invalid_plan():
    p = copy.deepcopy(BASE)
    p["hardware"]["gpu"] = "Z9000"
    r = max_seq_len(p)
    assert r["max_seq_len"] is None
    assert r["estimate"]["valid"] is False
    assert r["estimate"]["errors"][0]["field"] == "hardware.gpu"


def test_sweep_shape_keeps_the_gpu_count_and_dp_follows_sp():
    r = sweep(BASE, [1, 2, 4, 8], [8192, 32768, 131072])
    assert r["seq_lens"] == [8192, 32768, 131072]
    assert r["gpu_capacity_gib"] == 80.0
    assert [s["sp_size"] for s in r["series"]] == [1, 2, 4, 8]
    *valid, eight = r["series"]
    for s in valid:
        assert (s["gpus"], s["sp_size"] * s["dp_size"]) == (4, 4)  # the plan's 4 GPUs, dp = 4 / sp
        for key in ("peak_allocated_gib", "device_total_gib", "tokens_per_s", "fits"):
            assert len(s[key]) == 3
        assert s["peak_allocated_gib"] == sorted(s["peak_allocated_gib"])
    assert eight["valid"] is False
    assert "does not divide the plan's 4 GPUs" in eight["errors"][0]["message"]
    by_sp = {s["sp_size"]: s for s in valid}
    assert by_sp[4]["peak_allocated_gib"][-1] < by_sp[1]["peak_allocated_gib"][-1]
    assert by_sp[4]["max_seq_len"] > by_sp[1]["max_seq_len"]
    at = estimate(with_training(seq_len=32768))["memory"]["peak_allocated_gib"]
    assert by_sp[4]["peak_allocated_gib"][1] == at


def test_sweep_defaults_and_invalid_sp():
    r = sweep(BASE, None, None)
    sps = [s["sp_size"] for s in r["series"]]
    assert sps == [1, 2, 4]  # the head-compatible sizes that divide the plan's 4 GPUs
    assert len(r["seq_lens"]) >= 6
    assert r["seq_lens"] == sorted(r["seq_lens"])
    bad = sweep(BASE, [3, 4], [8192])
    assert bad["series"][0]["valid"] is False
    assert bad["series"][0]["errors"][0]["field"] == "parallel.sp_size"
    assert bad["series"][1]["valid"] is True


def test_exports_are_the_trainers_files():
    from plan import launch as launch_config  # the trainer builds its run from these functions

    x = exports(BASE)
    assert json.loads(x["deepspeed_json_hf_trainer"]) == launch_config.deepspeed_config(BASE)
    assert x["accelerate_yaml"] == launch_config.accelerate_config_yaml(BASE)
    assert "--nproc-per-node 4" in x["launch_command"]
    assert "worker.trainer" in x["launch_command"]
    two = copy.deepcopy(BASE)
    two["hardware"].update(gpus_per_node=2, num_nodes=2)
    assert "--nnodes 2" in exports(two)["launch_command"]
    assert exports({"model": {}})["valid"] is False


@pytest.mark.parametrize("features", [{}, {"tiled_logits_loss": True}, {"tiled_mlp": True},
                                      {"checkpoint_offload": True, "tiled_mlp": True, "tiled_logits_loss": True},
                                      {"activation_checkpointing": False}])
def test_memory_is_monotone_in_seq_len(features):
    # The bisection in max_seq_len relies on it; shard counts that round up must not make memory dip.
    from plan.memory import estimate_memory
    from plan.validation import validate

    _v = validate(with_training(**features))
    spec, errors = _v.spec, _v.errors
    assert spec is not None, errors
    prev = 0.0
    for k in range(1, 200_000, 97):
        m = estimate_memory(spec.with_(seq_len=4 * k))
        assert m["device_total"] >= prev - 1e-6, (4 * k, m["device_total"], prev)
        assert m["cpu_per_node"] >= 0
        prev = m["device_total"]
