"""The run page in Chromium against the real stack: the measured step-time breakdown beside the planner's, a shared
link that reopens the same zoom, smoothing and series, keyboard zoom, checkpoint download links, and no "stream"
line on an ended run. Metrics are synthetic values posted through the API's real ingest path (POST
/api/runs/{id}/metrics), as the trainer's forward_s / backward_s / optimizer_s arrive by the same path."""
import re
import statistics

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow


def _post(api, run_id: int, points: list[dict]) -> None:
    r = api.post(f"/api/runs/{run_id}/metrics", json={"points": points})
    assert r.status_code == 200, r.text


def _seconds(page, testid: str) -> float | None:
    raw = page.get_attribute(f"[data-testid={testid}]", "data-seconds")
    return None if raw == "" else float(raw)


def test_step_breakdown_draws_the_measured_parts_beside_the_planners(stack, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 50, "data": {"path": str(corpus)}}, name="ui-breakdown",
                 approve=False)
    rid = run["id"]
    steps = range(1, 31)
    # timings that vary by step, so the page's median of the last 20 is a figure it has to compute
    fwd = {s: 0.010 + 0.001 * (s % 7) for s in steps}
    bwd = {s: 0.020 + 0.002 * (s % 5) for s in steps}
    opt = {s: 0.004 + 0.0005 * (s % 3) for s in steps}
    total = {s: fwd[s] + bwd[s] + opt[s] + 0.003 for s in steps}
    parts = (("forward_s", fwd), ("backward_s", bwd), ("optimizer_s", opt), ("step_time_s", total))
    points = [{"rank": 0, "step": s, "name": name, "value": series[s]} for s in steps for name, series in parts]
    points += [{"rank": 0, "step": s, "name": "loss", "value": 6.0 - 0.05 * s} for s in steps]
    bwd[30] = 0.5  # a slower rank at the last step: the breakdown is the slowest rank's
    points.append({"rank": 1, "step": 30, "name": "backward_s", "value": 0.5})
    _post(api, rid, points)
    last20 = range(11, 31)
    want = {"forward_s": statistics.median(fwd[s] for s in last20),
            "backward_s": statistics.median(bwd[s] for s in last20),
            "optimizer_s": statistics.median(opt[s] for s in last20)}
    rest = statistics.median(total[s] for s in last20) - sum(want.values())
    predicted = api.get(f"/api/runs/{rid}").json()["estimate"]["throughput"]["time_breakdown_s"]
    # the planner's terms (plan/throughput.py), the host floor among them: on this tiny plan it is most of the step
    order = ["compute", "all_to_all", "zero_comm", "host_overhead", "optimizer_step", "offload_transfers"]
    assert set(predicted) == set(order)
    assert predicted["host_overhead"] > 0

    with chromium_page(height=1400) as page:
        page.goto(f"{stack.url}/#/runs/{rid}")
        page.wait_for_function("document.querySelector('[data-testid=step-breakdown]')?.dataset.steps === '30'",
                               timeout=20_000)
        for name, value in want.items():
            assert _seconds(page, f"measured-{name}") == pytest.approx(value, abs=1e-12), name
        assert _seconds(page, "measured-rest") == pytest.approx(rest, abs=1e-12)
        # what the trainer does not time apart is said so, never drawn as zero
        for part in ("communication", "offload"):
            assert _seconds(page, f"measured-{part}") is None
            assert "not measured" in page.inner_text(f"[data-testid=measured-{part}]")
        segments = page.locator("[data-testid=breakdown-measured-bar] .breakdown-seg")
        assert [segments.nth(i).get_attribute("data-part") for i in range(segments.count())] == [
            "forward_s", "backward_s", "optimizer_s", "rest"]
        for key, value in predicted.items():
            assert _seconds(page, f"predicted-{key}") == pytest.approx(value, rel=1e-12), key
            assert page.inner_text(f"[data-testid=predicted-{key}]").strip(), key               # a labelled row
        # the predicted bar: every non-zero term in the order of a step, each in a colour of its own
        bar = page.locator("[data-testid=breakdown-predicted-bar] .breakdown-seg")
        drawn = [bar.nth(i).get_attribute("data-part") for i in range(bar.count())]
        assert drawn == [k for k in order if predicted[k] > 0], drawn
        colours = [bar.nth(i).evaluate("e => getComputedStyle(e).backgroundColor") for i in range(bar.count())]
        assert len(set(colours)) == len(colours), dict(zip(drawn, colours))
        assert page.get_attribute("[data-testid=breakdown-chart]", "data-points") == "30"
        page.locator("[data-testid=step-breakdown]").scroll_into_view_if_needed()
        screenshot(page, "run-page-step-breakdown")

    # a run whose trainer writes only the step total: every part "not measured", nothing drawn
    other = submit(api, tiny_plan(sp_size=2), {"steps": 50, "data": {"path": str(corpus)}}, name="ui-breakdown-none",
                   approve=False)
    _post(api, other["id"], [{"rank": 0, "step": s, "name": n, "value": v} for s in steps
                             for n, v in (("step_time_s", 0.05), ("loss", 5.0))])
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs/{other['id']}")
        page.wait_for_function("Number(document.querySelector('[data-testid=step-time-chart]')?.dataset.points) === 30",
                               timeout=20_000)
        for name in ("forward_s", "backward_s", "optimizer_s"):
            assert _seconds(page, f"measured-{name}") is None
            assert "not measured" in page.inner_text(f"[data-testid=measured-{name}]")
        assert page.locator("[data-testid=breakdown-measured-bar] .breakdown-seg").count() == 0
        assert page.locator("[data-testid=measured-rest]").count() == 0
        assert "not measured" in page.inner_text("[data-testid=breakdown-chart-empty]")
    for r in (rid, other["id"]):
        api.post(f"/api/runs/{r}/cancel")


def _zoom_text(page) -> str:
    return page.inner_text("[data-testid=zoom-range]")


def test_a_copied_link_reopens_the_same_zoom_smoothing_and_series(stack, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 60, "data": {"path": str(corpus)}}, name="ui-share",
                 approve=False)
    rid = run["id"]
    _post(api, rid, [{"rank": 0, "step": s, "name": "loss", "value": 6.0 / (1 + 0.1 * s)} for s in range(60)]
          + [{"rank": r, "step": s, "name": "cpu_percent", "value": 50.0 + 10 * r + s % 4} for s in range(60)
             for r in (0, 1)])
    with chromium_page(height=1400) as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=stack.url)
        page.goto(f"{stack.url}/#/runs/{rid}")
        page.wait_for_function("document.querySelector('[data-testid=loss-chart]')?.dataset.points === '60'",
                               timeout=20_000)
        # keyboard zoom on the focused loss chart: + halves the range, the right arrow moves it a quarter on
        page.focus("[data-testid=loss-chart]")
        page.keyboard.press("+")
        page.wait_for_function("/zoom=\\d+-\\d+/.test(location.hash)", timeout=10_000)
        first = tuple(map(int, re.search(r"zoom=(\d+)-(\d+)", page.url).groups()))
        assert 0 < first[0] < first[1] < 59, first
        assert first[1] - first[0] <= 31, first
        # the zoom loads its range's points before the next key moves it on
        zoomed = api.get(f"/api/runs/{rid}/metrics", params={"name": "loss", "start": first[0], "end": first[1]}).json()
        page.wait_for_function("document.querySelector('[data-testid=loss-chart]')?.dataset.points === "
                               f"'{len(zoomed['series'][0]['step'])}'", timeout=20_000)
        page.keyboard.press("ArrowRight")
        page.wait_for_function(f"!location.hash.includes('zoom={first[0]}-{first[1]}')", timeout=10_000)
        start, end = map(int, re.search(r"zoom=(\d+)-(\d+)", page.url).groups())
        assert start > first[0], (first, start, end)
        assert end - start == first[1] - first[0], (first, start, end)
        stored = api.get(f"/api/runs/{rid}/metrics", params={"name": "loss", "start": start, "end": end}).json()
        n = len(stored["series"][0]["step"])
        page.wait_for_function(f"document.querySelector('[data-testid=loss-chart]')?.dataset.points === '{n}'",
                               timeout=20_000)
        assert _zoom_text(page) == f"steps {start}–{end}"
        # smoothing by keyboard, and rank 1 switched off in the CPU chart's legend
        page.focus("[data-testid=smoothing]")
        page.keyboard.press("ArrowLeft")
        assert page.inner_text("[data-testid=smoothing-value]") == "0.59"
        page.wait_for_function("document.querySelector('[data-testid=cpu-chart]')?.dataset.points !== '0'",
                               timeout=20_000)
        page.locator("[data-testid=cpu-chart] .u-legend .u-series", has_text="rank 1").click()
        page.click("[data-testid=copy-link]")
        page.wait_for_function("document.querySelector('[data-testid=copy-link]').textContent === 'Link copied'",
                               timeout=5_000)
        link = page.evaluate("navigator.clipboard.readText()")
    assert link.startswith(f"{stack.url}/#/runs/{rid}?"), link
    assert f"zoom={start}-{end}" in link, link
    assert "smooth=0.59" in link, link
    assert "hide=cpu-chart%7Erank+1" in link, link

    with chromium_page(height=1400) as page:  # a new browser context: only the link carries the state
        page.goto(link)
        page.wait_for_function(f"document.querySelector('[data-testid=loss-chart]')?.dataset.points === '{n}'",
                               timeout=20_000)
        assert _zoom_text(page) == f"steps {start}–{end}"
        assert page.inner_text("[data-testid=smoothing-value]") == "0.59"
        page.wait_for_function("document.querySelector('[data-testid=cpu-chart]')?.dataset.points !== '0'",
                               timeout=20_000)
        legend = page.locator("[data-testid=cpu-chart] .u-legend .u-series")
        off = {legend.nth(i).locator(".u-label").inner_text().strip():
               "u-off" in (legend.nth(i).get_attribute("class") or "") for i in range(legend.count())}
        assert off.get("rank 1") is True, off
        assert off.get("rank 0") is False, off
        # 0 on a focused chart shows the whole run again, and the link loses its zoom
        page.focus("[data-testid=loss-chart]")
        page.keyboard.press("0")
        page.wait_for_function("document.querySelector('[data-testid=loss-chart]')?.dataset.points === '60'",
                               timeout=20_000)
        assert "zoom=" not in page.url
        assert page.locator("[data-testid=zoom-range]").count() == 0
    api.post(f"/api/runs/{rid}/cancel")


def test_checkpoints_have_download_links_and_an_ended_run_shows_no_stream(stack, api, corpus):
    # a real 4-step CPU run that saves at steps 2 and 4 and keeps both
    run = submit(api, tiny_plan(sp_size=2), {"steps": 4, "checkpoint_every": 2, "keep_checkpoints": 2,
                                             "data": {"path": str(corpus)}}, name="ui-checkpoint-download")
    rid = wait_for(api, run["id"], {"succeeded"}, timeout_s=300)["id"]
    listed = api.get(f"/api/runs/{rid}/checkpoints").json()
    assert [(c["stage"], c["step"]) for c in listed] == [("stage0", 4), ("stage0", 2)], listed
    with chromium_page(height=1400) as page:
        page.goto(f"{stack.url}/#/runs/{rid}")
        page.locator("[data-testid=run-checkpoints]").wait_for(timeout=20_000)
        for c in listed:
            link = page.locator(f"[data-testid=checkpoint-download-{c['stage']}-{c['step']}]")
            # the backend's GET /api/runs/{id}/checkpoints/{name}, name = <stage>-checkpoint-<step>
            assert link.get_attribute("href") == f"/api/runs/{rid}/checkpoints/{c['stage']}-checkpoint-{c['step']}"
            assert link.get_attribute("download") is not None
        assert page.get_attribute("[data-testid=run-state]", "data-state") == "succeeded"
        assert page.locator("[data-testid=live-status]").count() == 0
        assert "stream" not in page.inner_text("[data-testid=run-header]")
        page.locator("[data-testid=run-checkpoints]").scroll_into_view_if_needed()
        screenshot(page, "run-page-checkpoint-download")

    # a run with no checkpoint on disk lists none, so offers no download; once cancelled it shows no stream either
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}}, name="ui-no-checkpoints",
                 approve=False)
    assert api.get(f"/api/runs/{run['id']}/checkpoints").json() == []
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs/{run['id']}")
        page.locator("[data-testid=live-status]").wait_for(timeout=20_000)  # a waiting run: its stream is shown
        assert api.post(f"/api/runs/{run['id']}/cancel").status_code == 200
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.dataset.state === 'cancelled'",
                               timeout=20_000)
        assert page.locator("[data-testid=live-status]").count() == 0
        assert page.locator("[data-testid=run-checkpoints]").count() == 0
        assert page.locator("[data-testid^=checkpoint-download-]").count() == 0
