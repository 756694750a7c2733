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
        # system figures (worker/trainer/system.py): every rank's CPU and resident memory; no GPU to read here
        ranks = trained_run["spec"]["parallel"]["sp_size"] * trained_run["spec"]["parallel"]["dp_size"]
        rss = api.get(f"/api/runs/{trained_run['id']}/metrics", params={"name": "rss_gib"}).json()["series"]
        assert [s["rank"] for s in rss] == list(range(ranks))
        assert all(0.1 < v < 64 for s in rss for v in s["last"])
        assert api.get(f"/api/runs/{trained_run['id']}/metrics",
                       params={"name": "gpu_util_percent"}).json()["series"] == []
        page.wait_for_function("Number(document.querySelector('[data-testid=rss-chart]')?.dataset.points) > 0",
                               timeout=20_000)
        assert page.locator("[data-testid=cpu-chart-empty]").count() == 0
        for chart in ("gpu-util-chart", "gpu-mem-chart", "gpu-power-chart", "gpu-temp-chart"):
            assert page.locator(f"[data-testid={chart}-empty]").inner_text() == "no GPU: this run ran on CPU ranks"
        screenshot(page, "run-page")


def test_loss_by_position_and_the_passkey_heatmap_of_a_trained_run(stack, api, trained_run):
    """The run's long-context evaluations, stored as metric points at their step: the held-back row's loss in log2
    position buckets at steps 6 and 12, one curve each, and the passkey grid after the stage (3 lengths x 3 depths)."""
    run_id = trained_run["id"]
    names = set(api.get(f"/api/runs/{run_id}/metrics/names").json())
    assert {"eval_loss", "pos_loss@1", "pos_loss@512", "passkey@128@0", "passkey@512@100"} <= names, names
    at = api.get(f"/api/runs/{run_id}/metrics", params={"name": "pos_loss@512"}).json()["series"][0]["step"]
    assert at == [6, 12], at
    scores = {n: api.get(f"/api/runs/{run_id}/metrics", params={"name": n}).json()["series"][0]
              for n in names if n.startswith("passkey@")}
    assert len(scores) == 9
    assert all(s["step"] == [12] and 0 <= s["last"][0] <= 1 for s in scores.values())
    with chromium_page(height=1400) as page:
        page.goto(f"{stack.url}/#/runs/{run_id}")
        page.wait_for_function("document.querySelector('[data-testid=position-loss-wrap]')?.dataset.evaluations "
                               "=== '2'", timeout=20_000)
        assert int(page.get_attribute("[data-testid=position-loss-chart]", "data-points")) == 10  # 10 buckets
        title = page.inner_text("[data-testid=position-loss-chart] .chart-title")
        assert "2 evaluation(s)" in title, title
        cell = page.locator("[data-testid=passkey-12-512-50]")
        cell.wait_for(timeout=20_000)
        assert float(cell.get_attribute("data-score")) == scores["passkey@512@50"]["last"][0]
        assert page.locator("[data-testid=passkey-heatmap-12] td").count() == 9
        page.locator("[data-testid=eval-charts]").scroll_into_view_if_needed()
        screenshot(page, "run-page-long-context-evals")


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
        assert "dashed" in tokens, tokens
        assert "not drawn" not in tokens, tokens
        assert "over 10x off the measurement: not drawn" in tflops, tflops
        page.locator("[data-testid=toggle-planner]").uncheck()
        tokens = page.locator("[data-testid=tokens-chart] .chart-title").inner_text()
        assert "dashed" not in tokens, tokens
        assert "planner:" in tokens, tokens
    api.post(f"/api/runs/{run['id']}/cancel")


def test_the_log_of_one_rank_is_shown_searched_and_downloaded(stack, api, trained_run):
    """torchrun tags each rank's lines ([rankN]: ); the run page shows one rank's (untagged), the launcher's, or the
    lines matching a search, and downloads exactly what it shows (all of it, not the last 500)."""
    run_id = trained_run["id"]
    full = api.get(f"/api/runs/{run_id}/log", params={"lines": 5000}).json()
    assert full["ranks"] == 2
    assert any(line.startswith("[rank1]: ") for line in full["lines"])
    rank1 = api.get(f"/api/runs/{run_id}/log", params={"lines": 5000, "rank": 1}).json()["lines"]
    assert rank1 == [line.removeprefix("[rank1]: ") for line in full["lines"] if line.startswith("[rank1]: ")]
    launcher = api.get(f"/api/runs/{run_id}/log", params={"lines": 5000, "launcher": True}).json()["lines"]
    assert launcher
    assert not any(line.startswith("[rank") for line in launcher)
    assert any("--- attempt 1" in line for line in launcher), launcher[:5]  # the worker's header line
    found = api.get(f"/api/runs/{run_id}/log", params={"rank": 0, "q": "OPTIMIZER:"}).json()["lines"]
    assert found, found
    assert all("optimizer:" in line.lower() for line in found), found
    bad = api.get(f"/api/runs/{run_id}/log", params={"rank": 2})
    assert bad.status_code == 422, bad.text
    assert bad.json()["detail"][0]["field"] == "rank", bad.text
    with chromium_page() as page:
        page.goto(f"{stack.url}/#/runs/{run_id}")
        log = page.locator("[data-testid=log-tail]")
        page.wait_for_function("document.querySelector('[data-testid=log-tail]')?.textContent.includes('[rank1]: ')",
                               timeout=20_000)
        page.select_option("[data-testid=log-source]", "rank1")
        page.wait_for_function("document.querySelector('[data-testid=log-tail]')?.dataset.source === 'rank1' && "
                               "!document.querySelector('[data-testid=log-tail]').textContent.includes('[rank')",
                               timeout=20_000)
        assert log.inner_text().strip() == "\n".join(rank1[-500:]).strip()
        page.fill("[data-testid=log-search]", "optimizer")
        page.select_option("[data-testid=log-source]", "rank0")
        page.wait_for_function("(t => t && t.split('\\n').every(l => l.toLowerCase().includes('optimizer')))("
                               "document.querySelector('[data-testid=log-tail]')?.textContent)", timeout=20_000)
        assert log.inner_text().strip() == "\n".join(found).strip()
        screenshot(page, "run-page-log-rank0-search")
        with page.expect_download() as download:
            page.click("[data-testid=log-download]")
        assert download.value.suggested_filename == f"run-{run_id}-rank0.log"
        assert open(download.value.path()).read() == "".join(f"{line}\n" for line in found)
        page.fill("[data-testid=log-search]", "")
        page.select_option("[data-testid=log-source]", "all")
        with page.expect_download() as download:
            page.click("[data-testid=log-download]")
        whole = open(download.value.path()).read().splitlines()
        assert download.value.suggested_filename == f"run-{run_id}.log"
        assert whole[-len(full["lines"]):] == full["lines"]
