"""The end-to-end checks in a real browser: the run page of a real trained run draws its loss points, and the
planner's predictions sit beside the measurements."""
import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan

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
            "n => Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) >= n",
            arg=n_points, timeout=20_000)
        assert int(chart.get_attribute("data-points")) == n_points
        assert page.locator("[data-testid=run-state]").inner_text().strip().lower() == "succeeded"
        # CPU ranks have no peak TFLOPS, so the trainer writes MFU as null: the page says so instead of waiting
        assert api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "mfu"}).json()["series"] == []
        assert "not reported" in page.locator("[data-testid=mfu-chart-empty]").inner_text()
        assert page.locator("[data-testid=grad-norm-chart-empty]").count() == 0
        # the plan says H100-80GB, the ranks ran on this CPU: the run says so and draws no H100 prediction over them
        assert "CPU ranks" in page.locator("[data-testid=run-device]").inner_text()
        assert "ran on CPU ranks" in page.locator("[data-testid=planner-hidden-cpu]").inner_text()
        assert "dashed" not in page.locator("[data-testid=tokens-chart] .chart-title").inner_text()
        screenshot(page, "run-page")


def test_planner_lines_are_drawn_near_the_measurement_and_left_out_when_over_10x_off(stack, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 50, "data": {"path": str(corpus)}}, name="ui-planner-lines",
                 approve=False)
    thr = api.get(f"/api/runs/{run['id']}").json()["estimate"]["throughput"]
    # tokens/s within 10% of the prediction; TFLOPS a hundredth of it (a GPU plan trained on CPU ranks, say)
    points = [{"rank": 0, "step": s, "name": name, "value": value}
              for s in (1, 2, 3) for name, value in (("loss", 5.0), ("tokens_per_s", 0.9 * thr["tokens_per_s"]),
                                                     ("tflops_per_gpu", thr["tflops_per_gpu"] / 100))]
    assert api.post(f"/api/runs/{run['id']}/metrics", json={"points": points}).status_code == 200
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs/{run['id']}")
        for chart in ("tokens-chart", "tflops-chart"):
            page.wait_for_function(f"document.querySelector('[data-testid={chart}]')?.dataset.points === '3'",
                                   timeout=20_000)
        tokens = page.locator("[data-testid=tokens-chart] .chart-title").inner_text()
        tflops = page.locator("[data-testid=tflops-chart] .chart-title").inner_text()
        assert "dashed" in tokens and "not drawn" not in tokens, tokens
        assert "over 10x off the measurement: not drawn" in tflops, tflops
        page.locator("[data-testid=toggle-planner]").uncheck()
        tokens = page.locator("[data-testid=tokens-chart] .chart-title").inner_text()
        assert "dashed" not in tokens and "planner:" in tokens, tokens
    api.post(f"/api/runs/{run['id']}/cancel")
