"""Learning from runs: a finished run's prediction and measurement are stored, gpu-check result files load as
measured rows, the error is summarized per GPU type and feature set, and the fitted correction is only applied
when asked (POST /api/calibration/estimate), beside the unchanged estimate. The run page's OOM fix comes from
GET /api/runs/{id}/fix."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.api.conftest import as_role
from tests.plans import alst_plan, qwen_plan

ROOT = Path(__file__).resolve().parents[2]

OOM_262K = {"model": {"preset": "meta-llama/Llama-3.1-8B"}, "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8},
            "parallel": {"sp_size": 4, "dp_size": 2}, "training": {"seq_len": 262144}}


def _run_with_metrics(spec: dict, state: str, metrics: dict[str, list[tuple[int, int, float]]]) -> int:
    from backend.core.db import session_scope
    from backend.metrics.models import MetricPoint
    from backend.runs.models import Run

    with session_scope() as s:
        run = Run(name="calibration", spec=spec, state=state, steps=3, last_step=3)
        s.add(run)
        s.flush()
        for name, pts in metrics.items():
            s.add_all(MetricPoint(run_id=run.id, rank=rank, step=step, name=name, value=v, wall_time=0.0)
                      for rank, step, v in pts)
        return run.id


def _record(run_id: int) -> None:
    from backend.calibration.service import record_run
    from backend.core.db import session_scope
    from backend.runs.models import Run

    with session_scope() as s:
        run = s.get_one(Run, run_id)
        record_run(s, run.id, run.attempt, run.spec)


@pytest.fixture(scope="module")
def points(client, tokens, app_env, tmp_path_factory):
    from backend.calibration.service import load_results
    from backend.core.db import session_scope

    p1, p2 = qwen_plan(seq_len=65536), qwen_plan(seq_len=32768, liger_kernel=True)
    # a run measured 10% over the prediction, on two ranks, tokens/s over three steps (the first is skipped)
    pred = {}
    for p in (p1, p2):
        est = client.post("/api/estimate", json=p, headers=as_role(client, tokens, "viewer")).json()
        pred[json.dumps(p)] = est
    e1 = pred[json.dumps(p1)]
    rid = _run_with_metrics(p1, "succeeded", {
        "peak_allocated_gib": [(0, 1, e1["memory"]["peak_allocated_gib"] * 1.05),
                               (1, 2, e1["memory"]["peak_allocated_gib"] * 1.10)],
        "peak_reserved_gib": [(0, 2, e1["memory"]["reserved_gib"] * 1.10)],
        "mfu": [(0, 2, 0.4)],                               # ranks with a peak FLOPS: a GPU run
        "tokens_per_s": [(0, 1, 1.0), (0, 2, e1["throughput"]["tokens_per_s"] * 0.9),
                         (0, 3, e1["throughput"]["tokens_per_s"] * 0.9)]})
    _record(rid)
    _record(rid)                                           # recording twice keeps one row
    d = tmp_path_factory.mktemp("results")
    (d / "plan2.json").write_text(json.dumps(p2))
    e2 = pred[json.dumps(p2)]
    (d / "gpu-h100.csv").write_text(
        "# gpu-check results\nplan,peak_allocated_gib,peak_reserved_gib,nvidia_smi_gib,tokens_per_s\n"
        f"plan2.json,{e2['memory']['peak_allocated_gib'] * 1.10},,{e2['memory']['device_total_gib'] * 1.2},"
        f"{e2['throughput']['tokens_per_s'] * 0.8}\n"
        "not-a-file.json,1,,,\n")
    with session_scope() as s:
        assert load_results(s, d) == 1                     # the unreadable row is skipped
    return {"run_id": rid}


def test_calibration_lists_predicted_and_measured(client, tokens, points):
    r = client.get("/api/calibration", headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    runs = [p for p in body["points"] if p["source"] == "run"]
    assert len(runs) == 1
    assert runs[0]["run_id"] == points["run_id"]
    p = runs[0]
    assert p["measured_peak_allocated_gib"] == pytest.approx(p["predicted_peak_allocated_gib"] * 1.10, rel=1e-3)
    assert p["measured_tokens_per_s"] == pytest.approx(p["predicted_tokens_per_s"] * 0.9, rel=1e-3)
    assert p["measured_device_total_gib"] is None          # the trainer reported no device total
    assert p["gpu"] == "H100-80GB"
    assert p["features"].startswith("zero3+sp")
    gpu = body["by_gpu"][0]
    assert gpu["gpu"] == "H100-80GB"
    assert gpu["n"] == 2
    assert gpu["errors"]["peak_allocated_gib"]["n"] == 2
    assert gpu["errors"]["peak_allocated_gib"]["mean_error"] == pytest.approx(1 / 1.1 - 1, rel=1e-2)
    corr = gpu["correction"]["peak_allocated_gib"]
    assert corr["factor"] == pytest.approx(1.10, rel=1e-3)
    assert corr["residual"] < 1e-3
    assert corr["n"] == 2
    assert gpu["correction"]["device_total_gib"] is None   # one point: no fit
    assert {f["features"] for f in body["by_features"]} == {p["features"] for p in body["points"]}


def test_correction_is_opt_in_and_beside_the_estimate(client, tokens, points):
    plan = qwen_plan(seq_len=49152)
    plain = client.post("/api/estimate", json=plan, headers=as_role(client, tokens, "viewer")).json()
    r = client.post("/api/calibration/estimate", json=plan, headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["estimate"]["memory"] == plain["memory"]       # never applied silently
    c = body["corrected"]["peak_allocated_gib"]
    assert c["corrected"] == pytest.approx(c["predicted"] * c["factor"])
    assert c["predicted"] == plain["memory"]["peak_allocated_gib"]
    # with measured rows for this GPU type the band is theirs: narrower than the corpus band, around the correction
    lo, hi = c["range"]
    clo, chi = plain["memory"]["peak_allocated_gib_range"]
    assert lo <= c["corrected"] <= hi
    assert hi - lo < chi - clo


def test_run_page_fix_for_an_oomed_run(client, tokens):
    rid = _run_with_metrics(OOM_262K, "oom", {})
    r = client.get(f"/api/runs/{rid}/fix", headers=as_role(client, tokens, "viewer"))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["fits"]
    assert body["changes"][0]["field"] == "training.liger_kernel"
    assert body["changes"][0]["from"] is False
    # a run that OOM'd although predicted to fit gets room for the planner's error
    from plan import max_seq_len
    fitted = alst_plan(8, 1, seq_len=max_seq_len(alst_plan(8, 1))["safe"])     # verdict "fits", at its edge
    rid = _run_with_metrics(fitted, "oom", {})
    body = client.get(f"/api/runs/{rid}/fix", headers=as_role(client, tokens, "viewer")).json()
    assert body["changes"]
    assert body["estimate"]["memory"]["device_total_gib_range"][1] <= 80 / 1.10


def test_recommend_and_fix_endpoints(client, tokens):
    h = as_role(client, tokens, "viewer")
    r = client.post("/api/estimate/recommend", json={"plan": {**OOM_262K, "parallel": {"sp_size": 4, "dp_size": 2}}},
                    headers=h)
    assert r.status_code == 200, r.text
    recs = r.json()["recommendations"]
    assert recs
    assert all(x["plan"]["parallel"] == {"sp_size": 4, "dp_size": 2} for x in recs)  # locked
    r = client.post("/api/estimate/fix", json=OOM_262K, headers=h)
    assert r.status_code == 200
    assert r.json()["changes"][0]["to"] is True
    r = client.post("/api/estimate/sp-methods", json=OOM_262K, headers=h)
    assert r.status_code == 200
    assert r.json()["label"] == "estimate: Ulysses Lab trains with Ulysses"


def test_a_cpu_run_is_filed_apart_from_the_gpu_it_plans_for(client, tokens, points):
    rid = _run_with_metrics(qwen_plan(seq_len=8192), "succeeded", {"peak_allocated_gib": [(0, 1, 0.5)],
                                                                  "tokens_per_s": [(0, 1, 10.0)]})
    _record(rid)
    body = client.get("/api/calibration", headers=as_role(client, tokens, "viewer")).json()
    mine = [p for p in body["points"] if p["run_id"] == rid]
    assert mine[0]["gpu"] == "cpu"
    assert next(g for g in body["by_gpu"] if g["gpu"] == "H100-80GB")["n"] == 2
    # measured on CPU ranks, compared with no GPU's prediction: the planner has none for CPU ranks
    assert (mine[0]["measured_tokens_per_s"], mine[0]["measured_peak_allocated_gib"]) == (10.0, 0.5)
    assert [mine[0][f"predicted_{f}"] for f in ("peak_allocated_gib", "reserved_gib", "device_total_gib",
                                               "tokens_per_s")] == [None] * 4
    cpu = next(g for g in body["by_gpu"] if g["gpu"] == "cpu")
    assert {f: e["n"] for f, e in cpu["errors"].items()} == dict.fromkeys(cpu["errors"], 0)
    assert set(cpu["correction"].values()) == {None}


def test_gpu_check_results_load_as_measured_rows(app_env, tmp_path):
    # the file `make gpu-check` writes (bench/gpu_check.py) is the file the API loads: one format, tested together

    from backend.calibration.service import load_results
    from backend.core.db import session_scope
    from bench import gpu_check
    plan = qwen_plan(seq_len=16384)
    row = {"model": "qwen", "seq_len": 16384, "features": "base", "kernel": "sdpa", "status": "ok",
           "plan": json.dumps(plan), "measured_allocated_gib": 30.5, "predicted_allocated_gib": 29.0,
           "measured_reserved_gib": 33.0, "nvidia_smi_gib": 34.2, "predicted_device_gib": 33.5,
           "step_time_s": 4.0, "tokens_per_s": 32768.0, "mfu": 0.4}
    for r in [row, {**row, "status": "skipped (time budget)", "plan": ""}, {**row, "status": "oom"},
              {**row, "status": "timeout"}, {**row, "status": "failed"}]:
        gpu_check.append_row(tmp_path / "gpu-x.csv", r)
    with session_scope() as s:
        assert load_results(s, tmp_path) == 1  # OOM, timed-out, failed and skipped rows are no measurements
    from sqlalchemy import select

    from backend.calibration.models import CalibrationPoint

    with session_scope() as s:
        point = s.scalar(select(CalibrationPoint).where(CalibrationPoint.source_ref == "gpu-x.csv:1"))
        assert (point.measured_peak_allocated_gib, point.measured_reserved_gib, point.measured_device_total_gib,
                point.measured_tokens_per_s) == (30.5, 33.0, 34.2, 32768.0)
