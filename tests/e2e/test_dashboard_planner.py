"""The planner page in Chromium against the real API: live estimate, breakdown, sweep, field errors, export."""
from tests.e2e.browser import chromium_page, screenshot

VALID = "document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'"


def _wait_valid(page, timeout=20_000):
    page.wait_for_function(VALID, timeout=timeout)


def _peak(page) -> float:
    return float(page.get_attribute("[data-testid=breakdown-bar]", "data-peak-gib"))


def _gib(page, part: str) -> float:
    return float(page.get_attribute(f"[data-testid=breakdown-{part}]", "data-gib"))


def test_breakdown_changes_when_sp_size_changes(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        # Default form: Qwen/Qwen3-4B on 4 x H100-80GB, seq_len 64K, sp_size 4 (dp follows: GPUs / sp).
        page.locator("[data-testid=breakdown-bar]").wait_for(timeout=20_000)
        _wait_valid(page)
        peak4, act4 = _peak(page), _gib(page, "activations")
        assert peak4 > 0
        assert act4 > 0

        page.fill("[data-testid=input-sp_size]", "2")
        page.wait_for_function(
            f"p => {VALID} && Number(document.querySelector('[data-testid=breakdown-bar]')?.dataset.peakGib) !== p",
            arg=peak4, timeout=20_000)
        peak2, act2 = _peak(page), _gib(page, "activations")
        # Half the SP degree: each GPU holds twice the tokens, so activations and the peak grow.
        assert act2 > act4
        assert peak2 > peak4
        assert page.input_value("[data-testid=input-dp_size]") == "2"

        # The sweep draws every sp_size up to the GPU count; more SP fits a longer context.
        page.locator("[data-testid=max-context-sp-4]").wait_for(timeout=20_000)
        max1 = int(page.get_attribute("[data-testid=max-context-sp-1] [data-seq]", "data-seq"))
        max4 = int(page.get_attribute("[data-testid=max-context-sp-4] [data-seq]", "data-seq"))
        assert max4 > max1
        assert int(page.get_attribute("[data-testid=sweep-chart]", "data-points")) > 0
        screenshot(page, "dashboard-planner")


def test_invalid_sp_size_shows_the_field_error(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        page.locator("[data-testid=breakdown-bar]").wait_for(timeout=20_000)
        _wait_valid(page)
        page.locator("[data-testid=sweep-chart]").wait_for(timeout=20_000)

        # Qwen3-4B has 32 attention heads: sp_size 6 cannot split them.
        page.fill("[data-testid=input-sp_size]", "6")
        err = page.locator("[data-testid='field-error-parallel.sp_size']")
        err.wait_for(timeout=20_000)
        assert "6" in err.inner_text()
        assert page.locator("[data-testid=breakdown-bar]").count() == 0
        # the sweep of the last valid plan is not left beside an invalid one
        assert page.locator("[data-testid=sweep-chart]").count() == 0
        assert page.locator("[data-testid=submit-run]").is_disabled()
        screenshot(page, "dashboard-planner-invalid-sp")

        # A value the schema rejects (0) is named beside the same field.
        page.fill("[data-testid=input-sp_size]", "0")
        page.wait_for_function(
            "() => (document.querySelector(\"[data-testid='field-error-parallel.sp_size']\")?.innerText || '')"
            ".length > 0 && !document.querySelector('[data-testid=breakdown-bar]')", timeout=20_000)

        # Fixing it clears the error and brings the estimate back.
        page.fill("[data-testid=input-sp_size]", "4")
        page.locator("[data-testid=breakdown-bar]").wait_for(timeout=20_000)
        _wait_valid(page)
        assert err.count() == 0
        assert page.locator("[data-testid=submit-run]").is_enabled()


def test_seq_len_suffix_and_export(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        before = _peak(page)
        page.fill("[data-testid=input-seq_len]", "128K")
        page.wait_for_function(
            f"p => {VALID} && Number(document.querySelector('[data-testid=breakdown-bar]')?.dataset.peakGib) > p",
            arg=before, timeout=20_000)
        page.fill("[data-testid=input-seq_len]", "12x")
        page.locator("[data-testid='field-error-training.seq_len']").wait_for(timeout=5_000)
        page.fill("[data-testid=input-seq_len]", "128K")
        _wait_valid(page)

        page.click("[data-testid=copy-launch_command]")
        text = page.locator("[data-testid=export-text]")
        text.wait_for(timeout=10_000)
        assert len(text.inner_text().strip()) > 10
        page.click("[data-testid=copy-deepspeed_json]")
        page.wait_for_function(
            "() => { try { const c = JSON.parse(document.querySelector('[data-testid=export-text]')?.innerText);"
            " return typeof c === 'object' && c !== null; } catch { return false; } }", timeout=10_000)
        screenshot(page, "dashboard-planner-export")

        # A link carries the plan: opened in a fresh page it restores the form.
        page.click("[data-testid=copy-link]")
        page.wait_for_function("document.querySelector('[data-testid=export-text]')?.innerText.includes('#/planner?plan=')",
                               timeout=10_000)
        link = page.inner_text("[data-testid=export-text]").strip()
    with chromium_page() as page:
        page.goto(link)
        _wait_valid(page)
        assert page.input_value("[data-testid=input-seq_len]") in ("131072", "128K")
        assert page.input_value("[data-testid=input-sp_size]") == "4"


def test_a_warning_is_shown_beside_its_field(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        # Qwen3-4B was trained with 40,960 positions: 1M tokens is allowed but warned about, next to seq_len.
        page.fill("[data-testid=input-seq_len]", "1M")
        page.fill("[data-testid=input-gpus_per_node]", "32")
        page.fill("[data-testid=input-sp_size]", "32")
        warning = page.locator("[data-testid='field-warning-training.seq_len']")
        warning.wait_for(timeout=20_000)
        assert "max_position_embeddings" in warning.inner_text()


def test_example_plan_and_picking_a_max_context_row(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.click("[data-testid=load-plan] summary")
        page.click("[data-testid=example-tiny]")
        assert page.input_value("[data-testid=input-sp_size]") == "2"
        assert page.input_value("[data-testid=input-seq_len]") == "512"
        assert page.input_value("[data-testid=run-data]") == "examples/data/sample.txt"
        _wait_valid(page)

        # The max-context table answers "what fits?" (safe / likely); a row sets sp_size and the safe seq_len.
        row = page.locator("[data-testid=max-context-sp-1]")
        row.wait_for(timeout=20_000)
        max1 = int(row.locator("[data-seq]").get_attribute("data-safe-seq"))
        assert 0 < max1 <= int(row.locator("[data-seq]").get_attribute("data-seq"))
        row.click()
        page.wait_for_function(f"{VALID} && document.querySelector('[data-testid=input-sp_size]')?.value === '1'",
                               timeout=20_000)
        seq_text = page.input_value("[data-testid=input-seq_len]")
        page.wait_for_function("document.querySelector('[data-testid=est-fits]')?.innerText === 'fits'", timeout=10_000)
        assert seq_text in (str(max1), f"{max1 // 1024}K", f"{max1 // (1 << 20)}M")

        # A pasted plan JSON that is not a plan is refused with a reason.
        page.fill("[data-testid=plan-json]", '{"model": {}}')
        page.click("[data-testid=load-plan-json]")
        page.locator("[data-testid=load-plan-error]").wait_for(timeout=5_000)


def test_custom_gpu(api_server):
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        _wait_valid(page)
        page.select_option("[data-testid=input-gpu]", "__custom__")
        # Starts from the selected catalog GPU's figures (H100-80GB), then the user changes them.
        assert page.input_value("[data-testid=input-gpu-memory_gib]") == "80"
        page.fill("[data-testid=input-gpu-memory_gib]", "40")
        page.wait_for_function(
            f"{VALID} && document.querySelector('[data-testid=breakdown-bar]')?.dataset.capacityGib === '40'",
            timeout=20_000)
        page.fill("[data-testid=input-gpu-bf16_dense_tflops]", "0")
        page.locator("[data-testid='field-error-hardware.gpu']").wait_for(timeout=10_000)
