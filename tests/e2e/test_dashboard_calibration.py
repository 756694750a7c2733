"""The Calibration page in Chromium with a real CPU run (tests/conftest.py trained_run: 2 CPU ranks of a plan that
names H100s): the run is listed under CPU ranks with what it measured, and "no CPU prediction" where a GPU's
prediction and error would have stood (the planner predicts for GPUs only), at 1280 px and 390 px."""
import pytest

from tests.e2e.browser import chromium_page, screenshot

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("width", [1280, 390])
def test_a_cpu_run_is_compared_with_no_gpus_prediction(api_server, api, trained_run, width):
    point = next(p for p in api.get("/api/calibration").json()["points"] if p["run_id"] == trained_run["id"])
    assert point["gpu"] == "cpu"
    assert point["measured_tokens_per_s"] > 0
    assert point["predicted_tokens_per_s"] is None
    with chromium_page(width=width, height=1400) as page:
        page.goto(f"{api_server}/#/calibration")
        row = page.locator(f"[data-testid=calibration-point-{point['id']}]")
        row.wait_for(timeout=20_000)
        assert row.get_attribute("data-device") == "cpu"
        text = row.inner_text()
        assert "CPU ranks × 2" in text, text
        assert "H100" not in text, text
        tokens = page.inner_text(f"[data-testid=calibration-point-{point['id']}-tokens]")
        assert tokens.startswith("no CPU prediction / "), tokens
        for figure in ("peak_allocated_gib", "tokens_per_s"):
            assert page.inner_text(f"[data-testid=calibration-error-cpu-{figure}]") == "no CPU prediction"
        assert "%" not in page.inner_text("[data-testid=calibration-gpu-cpu]")  # no error against a GPU
        row.scroll_into_view_if_needed()
        screenshot(page, f"dashboard-calibration-cpu-{width}")
