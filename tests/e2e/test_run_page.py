"""The end-to-end check in a real browser: the run page of a real trained run draws its loss points."""
import pytest

from tests.e2e.browser import chromium_page, screenshot

pytestmark = pytest.mark.slow


def test_run_page_shows_the_loss_curve_of_a_trained_run(stack, api, trained_run):
    stored = api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "loss"}).json()
    n_points = len(stored["series"][0]["step"])
    assert n_points >= 10
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs/{trained_run['id']}")
        chart = page.locator("[data-testid=loss-chart]")
        chart.wait_for(timeout=20_000)
        page.wait_for_function(
            "n => Number(document.querySelector('[data-testid=loss-chart]').dataset.points) >= n",
            arg=n_points, timeout=20_000)
        assert int(chart.get_attribute("data-points")) == n_points
        assert page.locator("[data-testid=run-state]").inner_text().strip().lower() == "succeeded"
        # CPU ranks have no peak TFLOPS, so the trainer writes MFU as null: the page says so instead of waiting
        assert api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "mfu"}).json()["series"] == []
        assert "not reported" in page.locator("[data-testid=mfu-chart-empty]").inner_text()
        assert page.locator("[data-testid=grad-norm-chart-empty]").count() == 0
        screenshot(page, "run-page")
