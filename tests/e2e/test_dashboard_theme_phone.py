"""The dashboard in Chromium against the real stack: dark mode from prefers-color-scheme (charts included), sortable
headers by keyboard, every page within a 390 px screen with the compare checkboxes visible, and an action's error
in the runs table on lines of readable width."""
import re
import time

import pytest

from tests.e2e.browser import ARTIFACTS, chromium_page, screenshot
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow

# Pixels of the loss chart's y-axis labels (the left 60 px of its canvas) that are light (every channel > 170, opaque)
# and dark (every channel < 90, opaque): labels are drawn in the scheme's ink on a transparent canvas.
AXIS_INK = """() => {
  const c = document.querySelector('[data-testid=loss-chart] canvas');
  const d = c.getContext('2d').getImageData(0, 0, Math.min(60, c.width), c.height).data;
  let light = 0, dark = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] < 200) continue;
    if (d[i] > 170 && d[i + 1] > 170 && d[i + 2] > 170) light++;
    if (d[i] < 90 && d[i + 1] < 90 && d[i + 2] < 90) dark++;
  }
  return [light, dark];
}"""

# Elements whose right edge passes the viewport, for the failure message (the widest first).
WIDE = """() => [...document.querySelectorAll('body *')]
  .map((e) => [e, e.getBoundingClientRect().right])
  .filter(([, r]) => r > window.innerWidth + 0.5)
  .sort((a, b) => b[1] - a[1]).slice(0, 8)
  .map(([e, r]) => `${e.tagName.toLowerCase()}.${[...e.classList].join('.')}[${e.dataset.testid ?? ''}]`
    + ` right=${Math.round(r)}`)"""


def _run_with_loss(api, corpus, name: str) -> int:
    run = submit(api, tiny_plan(sp_size=2), {"steps": 40, "data": {"path": str(corpus)}}, name=name, approve=False)
    points = [{"rank": 0, "step": s, "name": "loss", "value": 6.0 / (1 + 0.1 * s)} for s in range(40)]
    assert api.post(f"/api/runs/{run['id']}/metrics", json={"points": points}).status_code == 200
    return run["id"]


def test_dark_mode_follows_the_system_and_charts_stay_readable(stack, api, corpus):
    rid = _run_with_loss(api, corpus, "ui-dark")
    seen = {}
    for scheme in ("light", "dark"):
        with chromium_page(color_scheme=scheme) as page:
            page.goto(f"{stack.url}/#/runs/{rid}")
            page.wait_for_function("document.querySelector('[data-testid=loss-chart]')?.dataset.points === '40'",
                                   timeout=20_000)
            time.sleep(0.3)  # the canvas is drawn on the next frame
            seen[scheme] = {
                "body": page.evaluate("getComputedStyle(document.body).backgroundColor"),
                "card": page.evaluate("getComputedStyle(document.querySelector('.card')).backgroundColor"),
                "text": page.evaluate("getComputedStyle(document.querySelector('[data-testid=run-header]')).color"),
                "button": page.evaluate("getComputedStyle(document.querySelector('[data-testid=copy-link]'))"
                                        ".backgroundColor"),
                "axis": page.evaluate(AXIS_INK),
            }
            screenshot(page, f"run-page-{scheme}")
            if scheme == "dark":
                page.goto(f"{stack.url}/#/planner")
                page.locator("[data-testid=planner-results][data-state=valid]").wait_for(timeout=30_000)
                time.sleep(1)  # the sweep chart lands after its debounce
                screenshot(page, "planner-dark")
    light, dark = seen["light"], seen["dark"]
    assert light["body"] == "rgb(246, 247, 249)", seen
    assert dark["body"] == "rgb(11, 17, 32)", seen
    assert dark["card"] == "rgb(17, 24, 39)", seen
    assert dark["text"] == "rgb(229, 231, 235)", seen
    assert dark["button"] != "rgb(255, 255, 255)", seen  # no white buttons on a dark page
    # the axis labels are light ink in dark mode and dark ink in light mode
    assert dark["axis"][0] > 20, seen
    assert dark["axis"][1] == 0, seen
    assert light["axis"][1] > 20, seen
    assert light["axis"][0] == 0, seen
    api.post(f"/api/runs/{rid}/cancel")


def test_sortable_headers_work_by_keyboard(stack, api, corpus):
    names = ["ui-sort-b", "ui-sort-c", "ui-sort-a"]
    ids = [submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}}, name=n,
                  approve=False)["id"] for n in names]
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs")
        page.fill("[data-testid=runs-filter-text]", "ui-sort-")
        page.wait_for_function("document.querySelector('[data-testid=runs-table]')?.dataset.count === '3'",
                               timeout=20_000)
        header = page.locator("[data-testid=sort-name]")
        assert header.get_attribute("aria-sort") == "none"
        assert page.get_attribute("[data-testid=sort-id]", "aria-sort") == "descending"
        page.focus("[data-testid=sort-name] button")
        page.keyboard.press("Enter")
        page.wait_for_function("document.querySelector('[data-testid=sort-name]').getAttribute('aria-sort') "
                               "=== 'ascending'", timeout=5_000)
        shown = page.locator("[data-testid=runs-table] tbody td.name a").all_inner_texts()
        assert shown == sorted(names), shown
        assert page.get_attribute("[data-testid=sort-id]", "aria-sort") == "none"
        page.keyboard.press("Space")
        page.wait_for_function("document.querySelector('[data-testid=sort-name]').getAttribute('aria-sort') "
                               "=== 'descending'", timeout=5_000)
        shown = page.locator("[data-testid=runs-table] tbody td.name a").all_inner_texts()
        assert shown == sorted(names, reverse=True), shown
        # Tab reaches the next header's button
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.closest('th')?.dataset.testid") == "sort-state"
    for rid in ids:
        api.post(f"/api/runs/{rid}/cancel")


PAGES = ["planner", "plans", "runs", "compare", "calibration", "workers"]


def test_every_page_fits_a_390_px_screen(stack, api, corpus):
    rid = _run_with_loss(api, corpus, "ui-phone-with-a-long-name-that-has-to-wrap-somewhere-on-a-phone")
    other = _run_with_loss(api, corpus, "ui-phone-2")
    with chromium_page(width=390, height=844) as page:
        for name in PAGES + [f"runs/{rid}", f"compare?ids={rid},{other}"]:
            page.goto(f"{stack.url}/#/{name}")
            page.wait_for_load_state("networkidle")
            time.sleep(0.5)  # the planner's estimate and sweep land after their debounce
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, (name, width, page.evaluate(WIDE))
            if name == "runs":
                box = page.locator(f"[data-testid=select-{rid}]")
                assert box.is_visible()
                assert box.bounding_box()["x"] >= 0
                box.check()
                page.locator(f"[data-testid=select-{other}]").check()
                assert page.locator("[data-testid=compare-selected]").is_enabled()
            screenshot(page, "phone-" + re.sub(r"[^a-z0-9]+", "-", name))
    for r in (rid, other):
        api.post(f"/api/runs/{r}/cancel")


def test_an_action_error_in_the_runs_table_reads_on_wide_lines(stack, api, corpus):
    plan = tiny_plan(sp_size=2)
    # a made-up GPU with 0.1 GiB: the tiny model does not fit, so Approve answers with an error and "Approve anyway"
    plan["hardware"]["gpu"] = {"name": "tiny-gpu", "memory_gib": 0.1, "hbm_tb_per_s": 1, "bf16_dense_tflops": 10,
                               "nvlink_gb_per_s_per_direction": 10, "typical_internode_gb_per_s": 1}
    rid = submit(api, plan, {"steps": 5, "data": {"path": str(corpus)}}, name="ui-error-width", approve=False)["id"]
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs")
        page.click(f"[data-testid=approve-{rid}]")
        error = page.locator(f"[data-testid=action-error-{rid}]")
        error.wait_for(timeout=10_000)
        box = error.bounding_box()
        line = float(page.evaluate(f"parseFloat(getComputedStyle(document.querySelector("
                                   f"'[data-testid=action-error-{rid}]')).lineHeight) || 16"))
        text = error.inner_text()
        # before: about 120 px wide, one or two words a line; now at least 220 px, so 30+ characters a line
        assert box["width"] >= 220, (box, text)
        assert box["height"] / line <= len(text) / 30 + 1, (box, line, text)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        screenshot(page, "dashboard-runs-action-error")
    with chromium_page(width=390, height=844) as page:  # and on a phone it stays within the screen
        page.goto(f"{stack.url}/#/runs")
        page.fill("[data-testid=runs-filter-text]", "ui-error-width")
        page.click(f"[data-testid=approve-{rid}]")
        page.locator(f"[data-testid=action-error-{rid}]").wait_for(timeout=10_000)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390, page.evaluate(WIDE)
        screenshot(page, "phone-runs-action-error")
    api.post(f"/api/runs/{rid}/cancel")


def test_a_running_run_in_light_dark_and_at_390_px(stack, api, corpus):
    """The README's run-page screenshots, of a real CPU run while it trains: ETA, the step breakdown panel, the
    export buttons and the copy-link button, in light and dark, and at 390 px (no horizontal overflow)."""
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5000, "data": {"path": str(corpus)}}, name="ui-live-screens")
    rid = run["id"]
    try:
        for scheme, width in (("light", 1280), ("dark", 1280), ("light", 390)):
            with chromium_page(width=width, height=1000, color_scheme=scheme) as page:
                page.goto(f"{stack.url}/#/runs/{rid}")
                page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'running'"
                                       " && Number(document.querySelector('[data-testid=step-time-chart]')"
                                       "?.dataset.points) >= 3", timeout=240_000)
                eta = page.locator("[data-testid=run-eta]")
                eta.wait_for(timeout=10_000)
                assert eta.inner_text() not in ("", "–")
                for testid in ("step-breakdown", "download-metrics-csv", "download-metrics-parquet", "copy-link"):
                    assert page.locator(f"[data-testid={testid}]").is_visible(), testid
                time.sleep(0.5)
                assert page.evaluate("document.documentElement.scrollWidth") <= width, page.evaluate(WIDE)
                ARTIFACTS.mkdir(exist_ok=True)  # the top of the page, as the README shows it
                page.screenshot(path=str(ARTIFACTS / f"run-page-live-{scheme}-{width}.png"))
    finally:
        api.post(f"/api/runs/{rid}/cancel")
