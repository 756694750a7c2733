"""The max-context table is a list of layouts of the user's GPUs: every row keeps the GPU count (dp follows sp),
and clicking a row changes sp, dp and seq_len but never Nodes or GPUs per node."""
import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.e2e.test_dashboard_planner import VALID, _wait_valid

pytestmark = pytest.mark.slow


def test_rows_keep_the_gpu_count_and_a_click_keeps_the_nodes(api_server):
    with chromium_page(height=1400) as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.fill("[data-testid=input-num_nodes]", "2")  # 2 nodes x 4 GPUs, sp 4 -> dp 2
        _wait_valid(page)
        table = page.locator("[data-testid=max-context-table]")
        page.wait_for_function("document.querySelector('[data-testid=max-context-sp-1]') !== null", timeout=20_000)
        rows = table.locator("tbody tr")
        for i in range(rows.count()):
            cells = rows.nth(i).locator("td")
            sp, dp, gpus = (cells.nth(k).inner_text() for k in range(3))
            assert gpus == "8", (sp, dp, gpus)
            assert int(sp) * int(dp) == 8, (sp, dp, gpus)
        table.scroll_into_view_if_needed()
        screenshot(page, "dashboard-planner-max-context")
        page.click("[data-testid=max-context-sp-2]")
        page.wait_for_function(f"{VALID} && document.querySelector('[data-testid=input-sp_size]')?.value === '2'",
                               timeout=20_000)
        assert page.input_value("[data-testid=input-num_nodes]") == "2"
        assert page.input_value("[data-testid=input-gpus_per_node]") == "4"
        assert page.input_value("[data-testid=input-dp_size]") == "4"
