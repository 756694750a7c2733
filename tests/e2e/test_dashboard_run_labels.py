"""Runs you can work with, in Chromium: tags and notes written on the run page, a tag badge and the tag filter in
the runs list, and the final-loss column."""
import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow


def test_tags_notes_tag_filter_and_final_loss(stack, api, corpus):
    run = submit(api, tiny_plan(), {"steps": 3, "data": {"path": str(corpus)}}, name="labelled", approve=False)
    other = submit(api, tiny_plan(), {"steps": 3, "data": {"path": str(corpus)}}, name="untagged", approve=False)
    rid = run["id"]
    points = [{"step": s, "name": "loss", "value": v} for s, v in ((1, 6.5), (2, 5.25), (3, 4.125))]
    big = submit(api, tiny_plan(), {"steps": 3, "data": {"path": str(corpus)}}, name="diverged", approve=False)
    assert api.post(f"/api/runs/{big['id']}/metrics", json={"points": [{"step": 1, "name": "loss",
                                                                         "value": 7691.9}]}).status_code == 200
    assert api.post(f"/api/runs/{rid}/metrics", json={"points": points}).status_code == 200
    with chromium_page(height=1000) as page:
        page.goto(f"{stack.url}/#/runs/{rid}")
        page.locator("[data-testid=run-labels]").wait_for(timeout=20_000)
        # every stored point, as the run page's CSV button downloads it
        with page.expect_download() as info:
            page.click("[data-testid=download-metrics-csv]")
        assert info.value.suggested_filename == f"run-{rid}-metrics.csv"
        assert open(info.value.path()).read().splitlines()[1:] == [f"{s},0,loss,{v},0.0" for s, v in
                                                                   ((1, 6.5), (2, 5.25), (3, 4.125))]
        page.fill("[data-testid=run-tags-input]", "baseline, 64k")
        page.fill("[data-testid=run-notes-input]", "first of the lr sweep")
        page.click("[data-testid=run-labels-save]")
        status = "document.querySelector('[data-testid=run-labels-status]')?.innerText.trim()"
        page.wait_for_function(f"{status} === 'saved'", timeout=10_000)
        stored = api.get(f"/api/runs/{rid}").json()
        assert (stored["tags"], stored["notes"]) == (["64k", "baseline"], "first of the lr sweep")

        page.goto(f"{stack.url}/#/runs")
        page.locator(f"[data-testid=run-tag-{rid}-baseline]").wait_for(timeout=20_000)
        assert page.inner_text(f"[data-testid=run-loss-{rid}]") == "4.125"  # fmtValue: 4 significant digits
        assert page.inner_text(f"[data-testid=run-loss-{big['id']}]") == "7,692"  # not "7.6919k"
        page.select_option("[data-testid=runs-filter-tag]", "baseline")
        page.wait_for_function(f"() => !document.querySelector('[data-testid=run-row-{other['id']}]')", timeout=10_000)
        assert page.locator(f"[data-testid=run-row-{rid}]").is_visible()
        screenshot(page, "dashboard-runs-tags-final-loss")
