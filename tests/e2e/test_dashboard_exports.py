"""Exports in Chromium: plan.json downloads, and a two-node plan shows one Accelerate YAML and one torchrun line per
node; the YAML copied from the page loads in Accelerate's own loader."""
import json

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.e2e.test_dashboard_planner import _wait_valid

pytestmark = pytest.mark.slow


def test_plan_json_download_and_per_node_files(api_server, tmp_path):
    from accelerate.commands.config.config_args import load_config_from_file

    with chromium_page(height=1600) as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.fill("[data-testid=input-num_nodes]", "2")
        page.fill("[data-testid=input-sp_size]", "4")
        _wait_valid(page)
        with page.expect_download() as info:
            page.click("[data-testid=download-plan_json]")
        assert info.value.suggested_filename == "plan.json"
        saved = tmp_path / "plan.json"
        info.value.save_as(saved)
        assert json.loads(saved.read_text())["hardware"]["num_nodes"] == 2
        with page.expect_download() as info:  # the Slurm batch script for the same plan
            page.click("[data-testid=download-sbatch_script]")
        assert info.value.suggested_filename == "ulab-job.sbatch"
        script = open(info.value.path()).read()
        assert "#SBATCH --nodes=2" in script, script[:600]
        assert "#SBATCH --gpus-per-node=4" in script, script[:600]

        page.click("[data-testid=show-per-node]")
        page.locator("[data-testid=export-node-1-yaml]").wait_for(timeout=10_000)
        assert "--node-rank 1" in page.inner_text("[data-testid=export-node-1-launch]")
        page.locator("[data-testid=export-per-node]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-planner-export-per-node")
        for rank in (0, 1):
            path = tmp_path / f"node{rank}.yaml"
            path.write_text(page.inner_text(f"[data-testid=export-node-{rank}-yaml]"))
            config = load_config_from_file(str(path))
            assert (config.machine_rank, config.num_machines) == (rank, 2)
