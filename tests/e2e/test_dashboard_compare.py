"""Compare in Chromium: pick two runs from the table, overlay a metric, list the configuration differences."""
import time

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow


def test_compare_two_runs(api_server, api, trained_run, corpus):
    # The second run: sp_size 1, its loss points stored through the same batch endpoint the worker uses.
    other = submit(api, tiny_plan(sp_size=1), {"steps": 8, "data": {"path": str(corpus)}},
                   name="compare-sp1", approve=False)
    points = [{"rank": 0, "step": s, "name": "loss", "value": 6.0 - 0.3 * s, "wall_time": time.time()}
              for s in range(1, 9)]
    assert api.post(f"/api/runs/{other['id']}/metrics", json={"points": points}).status_code == 200
    trained_loss = api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "loss"}).json()
    n_trained = len(trained_loss["series"][0]["step"])

    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs")
        page.locator(f"[data-testid=select-{trained_run['id']}]").wait_for(timeout=20_000)
        # The table shows the trained run's last measured tokens/s, not the planner's (≈) prediction.
        page.wait_for_function(
            "id => { const t = document.querySelector(`[data-testid=run-tps-${id}]`)?.innerText || '≈';"
            " return !t.startsWith('≈') && t !== '–'; }", arg=trained_run["id"], timeout=20_000)
        page.check(f"[data-testid=select-{trained_run['id']}]")
        page.check(f"[data-testid=select-{other['id']}]")
        page.click("[data-testid=compare-selected]")
        page.wait_for_url(f"**#/compare?ids={trained_run['id']},{other['id']}", timeout=10_000)

        page.wait_for_function("n => Number(document.querySelector('[data-testid=compare-chart]')"
                               "?.dataset.points) === n",
                               arg=n_trained + 8, timeout=20_000)
        row = page.locator("[data-testid='diff-parallel.sp_size'] td")
        row.first.wait_for(timeout=10_000)
        assert [c.strip() for c in row.all_inner_texts()] == ["parallel.sp_size", "2", "1"]
        assert page.locator("[data-testid='diff-training.seq_len']").count() == 0  # same in both: not a difference
        screenshot(page, "dashboard-compare")

        # Another metric: only the trained run has grad_norm.
        page.select_option("[data-testid=compare-metric]", "grad_norm")
        n_grad = len(api.get(f"/api/runs/{trained_run['id']}/metrics",
                               params={"name": "grad_norm"}).json()["series"][0]["step"])
        page.wait_for_function("n => Number(document.querySelector('[data-testid=compare-chart]')"
                               "?.dataset.points) === n",
                               arg=n_grad, timeout=20_000)
