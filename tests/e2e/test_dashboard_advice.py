"""Planner v2 in Chromium against the real API: the Recommend panel ("use this" loads the plan into the form), the
minimal fix beside a plan that does not fit and on the page of a run that ended `oom`, and the Calibration page
(a real CPU run recorded by the worker, and a gpu-check results file loaded through the API)."""
from __future__ import annotations

import base64
import json

from sqlalchemy import create_engine, text

from tests.e2e.browser import chromium_page, screenshot

VALID = "document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'"
GUIDE_512K = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
              "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4, "cpu_memory_gib_per_node": 1900},
              "parallel": {"sp_size": 32, "dp_size": 1}, "training": {"seq_len": 524288}}
OOM_262K = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
            "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 1, "cpu_memory_gib_per_node": 1900},
            "parallel": {"sp_size": 4, "dp_size": 2}, "training": {"seq_len": 262144}}


def link(base: str, plan: dict) -> str:
    b64 = base64.urlsafe_b64encode(json.dumps(plan).encode()).decode().rstrip("=")
    return f"{base}/#/planner?plan={b64}"


def test_recommend_panel_and_use_this(api_server):
    with chromium_page(height=1400) as page:
        page.goto(link(api_server, GUIDE_512K))
        page.wait_for_function(VALID, timeout=20_000)
        page.click("[data-testid=recommend-run]")
        first = page.locator("[data-testid=recommendation-0]")
        first.wait_for(timeout=30_000)
        assert page.locator("[data-testid^=recommendation-]").count() >= 3
        text_ = first.inner_text()
        assert "tokens/s" in text_
        assert ("NVLink" in text_ or "nodes" in text_)
        assert page.inner_text("[data-testid=rec-tps-0]") not in ("", "–")
        first.scroll_into_view_if_needed()
        screenshot(page, "dashboard-recommend")
        summary = first.locator("b").first.inner_text()          # "sp 2 × dp 16, ZeRO-3, ..."
        sp = summary.split("sp ")[1].split(" ")[0]
        page.click("[data-testid=use-recommendation-0]")
        page.wait_for_function(f"() => document.querySelector('[data-testid=input-sp_size]')?.value === '{sp}'",
                               timeout=20_000)
        page.wait_for_function(VALID, timeout=20_000)
        page.wait_for_function("() => document.querySelector('[data-testid=est-fits]')?.innerText === 'fits'",
                               timeout=20_000)
        assert page.is_checked("[data-testid=input-liger_kernel]") == ("Liger" in summary)


def test_fix_beside_a_plan_that_does_not_fit(api_server):
    with chromium_page(height=1300) as page:
        page.goto(link(api_server, OOM_262K))
        page.wait_for_function(VALID, timeout=20_000)
        assert page.inner_text("[data-testid=est-fits]") == "does not fit"
        change = page.locator("[data-testid=fix-change-0]")
        change.wait_for(timeout=20_000)
        assert "training.liger_kernel" in change.inner_text()
        assert "free" in page.inner_text("[data-testid=fix-cost]")
        page.locator("[data-testid=fix-panel]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-fix-plan")
        page.click("[data-testid=fix-apply]")
        page.wait_for_function("() => document.querySelector('[data-testid=est-fits]')?.innerText === 'fits'",
                               timeout=20_000)
        assert page.is_checked("[data-testid=input-liger_kernel]")
        assert page.locator("[data-testid=fix-panel]").count() == 0


def test_fix_on_the_page_of_an_oomed_run(stack, api, corpus):
    r = api.post("/api/plans", json={"name": "oom-262k", **OOM_262K})
    assert r.status_code == 201, r.text
    run = api.post("/api/runs", json={"plan_id": r.json()["id"], "name": "oom-262k",
                                      "run": {"steps": 2, "data": {"path": str(corpus)},
                                              "model_path": "meta-llama/Llama-3.1-8B"}})
    assert run.status_code == 201, run.text
    rid = run.json()["id"]
    # A CPU worker cannot run out of GPU memory: the state an H100 would have left is written as the worker does.
    engine = create_engine(stack.env["ULAB_DATABASE_URL"])
    with engine.begin() as conn:
        conn.execute(text("UPDATE runs SET state = 'oom', exit_reason = :r WHERE id = :id"),
                     {"r": "exit code 3:\ntorch.OutOfMemoryError: CUDA out of memory.", "id": rid})
    engine.dispose()
    with chromium_page(height=1100) as page:
        page.goto(f"{stack.url}/#/runs/{rid}")
        change = page.locator("[data-testid=run-fix-change-0]")
        change.wait_for(timeout=20_000)
        assert "training.liger_kernel" in change.inner_text()
        page.locator("[data-testid=run-fix-card]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-fix-oom-run")
        page.click("[data-testid=run-fix-apply]")
        page.wait_for_function(VALID, timeout=20_000)
        assert page.is_checked("[data-testid=input-liger_kernel]")
        assert page.inner_text("[data-testid=est-fits]") == "fits"


def test_calibration_page(stack, api, trained_run):
    (stack.home / "results").mkdir(exist_ok=True)
    plan = json.loads(json.dumps(OOM_262K))
    plan["training"]["liger_kernel"] = True
    est = api.post("/api/estimate", json=plan).json()
    m = est["memory"]
    rows = [(plan, 1.06, 1.10, 0.85), ({**plan, "training": {**plan["training"], "seq_len": 131072}}, 1.04, 1.08, 0.9)]
    lines = ["plan,peak_allocated_gib,peak_reserved_gib,nvidia_smi_gib,tokens_per_s"]
    for p, a, d, t in rows:
        e = api.post("/api/estimate", json=p).json()
        lines.append('"' + json.dumps(p).replace('"', '""') + f'",{e["memory"]["peak_allocated_gib"] * a},,'
                     f'{e["memory"]["device_total_gib"] * d},{e["throughput"]["tokens_per_s"] * t}')
    (stack.home / "results" / "gpu-h100-e2e.csv").write_text("\n".join(lines) + "\n")
    r = api.post("/api/calibration/load")
    assert r.status_code == 200, r.text
    assert r.json()["rows"] == 2, r.text
    assert m["fits"]
    body = api.get("/api/calibration").json()
    runs = [p for p in body["points"] if p["run_id"] == trained_run["id"]]
    assert len(runs) == 1
    assert runs[0]["measured_tokens_per_s"] > 0  # recorded by the worker at the run's end
    with chromium_page(height=1000) as page:
        page.goto(f"{stack.url}/#/calibration")
        page.locator("[data-testid=calibration-by-gpu]").wait_for(timeout=20_000)
        page.locator(f"[data-testid=calibration-point-{runs[0]['id']}]").wait_for(timeout=20_000)
        corr = page.inner_text("[data-testid='correction-H100-80GB-device_total_gib']")
        assert corr.startswith("×1.0")
        assert "residual" in corr
        screenshot(page, "dashboard-calibration")
