"""What a run will cost, in Chromium against the real API: the planner page's run-cost card turns a token budget
into the estimate's wall time and GPU-hours with a range (the API's own `cost` summary), and refuses a budget it
cannot read."""
from __future__ import annotations

from plan import estimate
from tests.e2e.browser import chromium_page, screenshot, to_docs
from tests.e2e.test_dashboard_verdict import VALID, link

PLAN = {"model": {"preset": "meta-llama/Llama-3.1-8B"},
        "hardware": {"gpu": "H100-80GB", "gpus_per_node": 8, "num_nodes": 4, "cpu_memory_gib_per_node": 1900},
        "parallel": {"sp_size": 8, "dp_size": 4}, "training": {"seq_len": 131072, "grad_accum": 1}}


def test_planner_page_shows_what_a_run_will_cost(api_server):
    want = estimate(PLAN, train_tokens=20_000_000_000)["cost"]
    with chromium_page(height=1700) as page:
        page.goto(link(api_server, PLAN))
        page.wait_for_function(VALID, timeout=20_000)
        assert page.locator("[data-testid=cost-summary]").count() == 0     # no budget yet: nothing to cost
        page.fill("[data-testid=train-tokens]", "20B")
        page.locator("[data-testid=cost-summary]").wait_for(timeout=20_000)
        assert page.inner_text("[data-testid=cost-summary]") == want["summary"]
        assert page.inner_text("[data-testid=cost-steps]") == f"{want['steps']:,}"
        assert page.inner_text("[data-testid=cost-gpus]") == "32"
        shot = screenshot(page, "planner-run-cost")
        to_docs(shot, "planner-run-cost.png")

        page.fill("[data-testid=train-tokens]", "lots")
        page.locator("[data-testid=train-tokens-error]").wait_for(timeout=5_000)
        page.wait_for_function("!document.querySelector('[data-testid=cost-summary]')", timeout=20_000)
