""""Measure this plan" in Chromium: the planner page queues a probe run (kind "probe") through the real Celery worker,
which trains the plan at 1 and 2 of its 3 layers on a CPU rank (sp=1; both depths in one process) and
extrapolates; the page shows measured beside
predicted with the verdict line, the result is stored with the plan and filed in the calibration store under "cpu"."""
import json

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.e2e.test_dashboard_runs import _fill_tiny_plan
from tests.tiny import tiny_plan

pytestmark = pytest.mark.slow
VALID = "document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'"


def test_measure_this_plan_shows_measured_beside_predicted(api_server, api):
    config = {**tiny_plan()["model"]["config"], "num_hidden_layers": 3}
    with chromium_page(height=1600) as page:
        page.goto(f"{api_server}/#/planner")
        page.locator("[data-testid=planner-form]").wait_for(timeout=20_000)
        _fill_tiny_plan(page, sp_size=1)
        page.fill("[data-testid=input-config]", json.dumps(config))
        page.wait_for_function(VALID, timeout=20_000)
        page.click("[data-testid=probe-plan]")
        page.locator("[data-testid=probe-verdict]").wait_for(timeout=600_000)
        verdict = page.inner_text("[data-testid=probe-verdict]")
        assert verdict.startswith("measured: fits with 80 GiB to spare"), verdict
        row = page.inner_text("[data-testid=probe-row-peak_allocated_gib]")
        assert "extrapolated" in row, row
        assert "depths 1 (ok), 2 (ok) on CPU ranks" in page.inner_text("[data-testid=probe-result]")
        # measured on CPU ranks: labelled so, and compared with no GPU's prediction
        assert "measured on CPU ranks (3 layers)" in page.inner_text("[data-testid=probe-result] thead")
        assert page.inner_text("[data-testid=probe-row-tokens_per_s] td:nth-child(3)") == "no CPU prediction"
        page.locator("[data-testid=probe-panel]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-probe")
        run_id = int(page.inner_text("[data-testid=probe-status]").split()[2].rstrip(":"))
    run = api.get(f"/api/runs/{run_id}").json()
    assert run["kind"] == "probe"
    assert run["state"] == "succeeded"
    assert run["approved_by"] is not None
    stored = api.get(f"/api/plans/{run['plan_id']}").json()["probe"]
    assert stored["run_id"] == run_id
    assert stored["plan_depth"] == 3
    assert stored["depths"] == [1, 2]
    assert stored["extrapolated"]["peak_allocated_gib"] > 0
    assert stored["predicted"]["peak_allocated_gib"] > 0
    points = [p for p in api.get("/api/calibration").json()["points"] if p["run_id"] == run_id]
    assert [(p["source"], p["gpu"]) for p in points] == [("probe", "cpu")]
    assert points[0]["predicted_tokens_per_s"] is None
    assert run["device"] == "cpu"
    with chromium_page() as page:  # the runs list names what the probe ran on, with no GPU's tokens/s beside it
        page.goto(f"{api_server}/#/runs")
        row = page.locator(f"[data-testid=run-row-{run_id}]")
        row.wait_for(timeout=20_000)
        assert "CPU ranks × 1" in row.inner_text(), row.inner_text()
        assert "H100" not in row.inner_text(), row.inner_text()
