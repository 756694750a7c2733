"""The planner's "Paste your DeepSpeed config / launch line" in Chromium: the guide's ds_config and launch line come
back as a plan with its estimate, the warnings (each naming its key) and the one error, and load into the form."""
from pathlib import Path

import pytest

from tests.e2e.browser import ARTIFACTS, chromium_page, screenshot
from tests.e2e.test_dashboard_planner import _wait_valid

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "imports"


def test_paste_the_guide_setup(api_server):
    with chromium_page(height=1400) as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.click("[data-testid=import-setup] > summary")
        page.fill("[data-testid=import-ds-config]", (FIXTURES / "guide_ds_config.json").read_text())
        page.fill("[data-testid=import-launch]", (FIXTURES / "guide_launch.txt").read_text().strip())
        page.click("[data-testid=import-run]")
        page.locator("[data-testid=import-result]").wait_for(timeout=15_000)
        warnings = [page.locator("[data-testid=import-warning]").nth(i).get_attribute("data-field")
                    for i in range(page.locator("[data-testid=import-warning]").count())]
        assert sorted(warnings) == ["fp16.enabled", "gradient_accumulation_steps", "sequence_parallelism"]
        assert "DeepSpeed ignores this block" in page.inner_text("[data-testid=import-warning][data-field="
                                                                  "sequence_parallelism]")
        error = page.locator("[data-testid=import-error]")
        assert error.count() == 1
        assert error.get_attribute("data-field") == "--num_gpus"
        assert "--num_gpus=32 on one node, but a node has 8" in error.inner_text()
        plan_text = page.inner_text("[data-testid=import-plan]")
        assert "4 × 8 H100-80GB" in plan_text
        assert "ZeRO-3 fp16" in plan_text
        assert "does not fit" in page.inner_text("[data-testid=import-estimate]")
        page.locator("[data-testid=import-setup]").scroll_into_view_if_needed()
        path = screenshot(page, "dashboard-planner-import")
        assert path.stat().st_size > 10_000
        # the panel alone: docs/screenshots/import-setup.png is a copy of it
        panel = ARTIFACTS / "dashboard-planner-import-panel.png"
        page.locator("[data-testid=import-setup]").screenshot(path=str(panel))
        page.click("[data-testid=import-load]")  # the imported plan becomes the form's
        page.wait_for_function("() => document.querySelector('[data-testid=input-num_nodes]')?.value === '4'")


def test_malformed_paste_names_the_line(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.click("[data-testid=import-setup] > summary")
        page.fill("[data-testid=import-ds-config]", '{\n  "fp16": {"enabled": true},\n}')
        page.click("[data-testid=import-run]")
        page.locator("[data-testid=import-failed]").wait_for(timeout=15_000)
        assert "line 3" in page.inner_text("[data-testid=import-failed]")
