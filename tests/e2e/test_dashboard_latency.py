"""How long a new metric point takes to reach an open run page (API batch ingest -> SSE -> chart).
Measured, printed and saved to test-artifacts/sse-latency.json; not a timed assertion. The whole
path from the trainer's write is bench/stream_latency.py."""
import json
import statistics
import time

import pytest

from tests.e2e.browser import ARTIFACTS, WATCH_LOSS_CHART, chromium_page, screenshot
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow


def test_a_new_point_reaches_the_open_run_page(api_server, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 50, "data": {"path": str(corpus)}},
                 name="ui-latency", approve=False)
    rid = run["id"]
    latencies_ms = []
    with chromium_page() as page:
        page.goto(f"{api_server}/#/runs/{rid}")
        page.wait_for_function("document.querySelector('[data-testid=live-status]')?.dataset.live === 'open'",
                               timeout=20_000)
        page.locator("[data-testid=loss-chart]").wait_for()
        page.evaluate(WATCH_LOSS_CHART)
        for step in range(1, 21):
            sent_ms = time.time() * 1000
            r = api.post(f"/api/runs/{rid}/metrics", json={"points": [
                {"rank": 0, "step": step, "name": "loss", "value": 5.0 - 0.1 * step, "wall_time": sent_ms / 1000}]})
            assert r.status_code == 200, r.text
            page.wait_for_function(
                "n => window.__arrivals.some(([p]) => p >= n)", arg=step, timeout=20_000)
            arrived = page.evaluate("n => window.__arrivals.find(([p]) => p >= n)[1]", step)
            latencies_ms.append(arrived - sent_ms)
            time.sleep(0.1)
        assert int(page.get_attribute("[data-testid=loss-chart]", "data-points")) == 20
        screenshot(page, "dashboard-run-latency")
    api.post(f"/api/runs/{rid}/cancel")
    report = {"samples": len(latencies_ms), "median_ms": statistics.median(latencies_ms),
              "p90_ms": sorted(latencies_ms)[int(0.9 * len(latencies_ms)) - 1], "max_ms": max(latencies_ms)}
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "sse-latency.json").write_text(json.dumps(report, indent=2))
    print(f"\nnew point -> open run page: {report}")
