"""The planner's submit form in Chromium: it keeps a loaded example's run fields (checkpoint_every), offers
model_path, seed, warmup, the LR schedule and checkpoint settings, and a run submitted from it with a checkpoint
under the models root (ULAB_MODELS_DIR) trains from that checkpoint (its weights and its tokenizer, through
from_pretrained) to succeeded, and lists the checkpoint it kept."""
import json
import re

import pytest

from tests.checkpoints import save_tiny_checkpoint
from tests.e2e.browser import chromium_page, screenshot
from tests.e2e.test_dashboard_runs import _fill_tiny_plan
from tests.tiny import wait_for

pytestmark = pytest.mark.slow
VALID = "document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'"


def test_a_loaded_example_keeps_its_checkpoint_every(api_server):
    example = json.load(open("examples/tiny-llama-sp2.json"))
    with chromium_page() as page:
        page.goto(f"{api_server}/#/planner")
        page.wait_for_function(VALID, timeout=30_000)
        page.click("[data-testid=load-plan] summary")
        page.click("[data-testid=example-tiny]")
        assert page.input_value("[data-testid=run-checkpoint_every]") == str(example["run"]["checkpoint_every"])


def test_submit_from_the_form_with_a_checkpoint_under_the_models_root(stack, api, corpus):
    directory = save_tiny_checkpoint(stack.home / "models" / "acme" / "ui-tiny")
    with chromium_page(height=1400) as page:
        page.goto(f"{stack.url}/#/planner")
        page.locator("[data-testid=planner-form]").wait_for(timeout=20_000)
        _fill_tiny_plan(page)
        page.fill("[data-testid=run-name]", "from-the-form")
        page.fill("[data-testid=run-steps]", "4")
        page.fill("[data-testid=run-data]", str(corpus))
        page.fill("[data-testid=run-model_path]", "acme/ui-tiny")
        page.fill("[data-testid=run-seed]", "3")
        page.fill("[data-testid=run-warmup_steps]", "1")
        page.fill("[data-testid=run-checkpoint_every]", "2")
        page.fill("[data-testid=run-keep_checkpoints]", "1")
        page.fill("[data-testid=run-eval_rows]", "1")
        page.fill("[data-testid=run-eval_every]", "2")
        page.select_option("[data-testid=run-lr_scheduler]", "cosine")
        page.wait_for_function(VALID, timeout=20_000)
        page.locator("[data-testid=submit-run]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-submit-run-fields")
        page.click("[data-testid=submit-run]")
        page.wait_for_url(re.compile(r".*#/runs/\d+$"), timeout=20_000)
        run_id = int(page.url.rsplit("/", 1)[1])
    run = api.get(f"/api/runs/{run_id}").json()["spec"]["run"]
    assert run["model_path"] == str(directory.resolve())
    assert (run["seed"], run["warmup_steps"], run["checkpoint_every"], run["keep_checkpoints"], run["lr_scheduler"],
            run["eval_rows"], run["eval_every"]) == (3, 1, 2, 1, "cosine", 1, 2)
    assert api.post(f"/api/runs/{run_id}/approve").status_code == 200
    assert wait_for(api, run_id, {"succeeded"}, timeout_s=300)["last_step"] == 4
    # the trainer tokenized with the checkpoint's own tokenizer: model_path reached from_pretrained
    data = json.loads((stack.home / "runs" / f"run-{run_id}" / "data" / "stage0.json").read_text())
    assert data["tokenizer"] == f"hf:{directory.resolve()}"
    # the held-back row scored by position at steps 2 and 4, with the checkpoint's tokenizer
    evals = api.get(f"/api/runs/{run_id}/metrics", params={"name": "eval_loss"}).json()["series"][0]
    assert evals["step"] == [2, 4], evals
    assert all(v > 0 for v in evals["last"]), evals
    # the checkpoint list reads the run directory: keep_checkpoints (1) of the saves at steps 2 and 4
    listed = api.get(f"/api/runs/{run_id}/checkpoints").json()
    assert [(c["stage"], c["step"]) for c in listed] == [("stage0", 4)]
    assert listed[0]["bytes"] > 0
    with chromium_page(height=1400) as page:  # keep_checkpoints 1: the save at step 4 is the one left
        page.goto(f"{stack.url}/#/runs/{run_id}")
        page.locator("[data-testid=checkpoint-stage0-4]").wait_for(timeout=20_000)
        assert page.locator("[data-testid=run-checkpoints] tbody tr").count() == 1
        page.locator("[data-testid=run-checkpoints]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-run-checkpoints")


def test_the_form_is_as_strict_as_the_cli(api_server, api):
    """A misspelt key pasted into "Load into the form" is refused by name with the API's hint, as are an
    unknown GPU and preset (never dropped, nor shown as another valid value); a refused submit says why beside the
    field and stores no plan."""
    import copy

    from tests.tiny import tiny_plan

    plans_before = len(api.get("/api/plans").json())
    misspelt = copy.deepcopy(tiny_plan())
    misspelt["training"]["offload_optimiser"] = True
    unknown_gpu = copy.deepcopy(tiny_plan())
    unknown_gpu["hardware"]["gpu"] = "H900"
    with chromium_page(height=1400) as page:
        page.goto(f"{api_server}/#/planner")
        page.wait_for_function(VALID, timeout=30_000)
        page.click("[data-testid=load-plan] summary")
        for plan, said in ((misspelt, "training.offload_optimiser: unknown field; did you mean offload_optimizer?"),
                           (unknown_gpu, "hardware.gpu: unknown GPU 'H900'; known GPUs: A100-40GB")):
            page.fill("[data-testid=plan-json]", json.dumps(plan))
            page.click("[data-testid=load-plan-json]")
            # the previous plan's error is still shown until this plan's answer replaces it: wait for this one's
            page.wait_for_function("said => document.querySelector('[data-testid=load-plan-error]')"
                                   "?.innerText.includes(said)", arg=said, timeout=10_000)
            assert said in page.inner_text("[data-testid=load-plan-error]")
        assert page.input_value("[data-testid=input-gpus_per_node]") != "2"  # the refused plan was not loaded
        screenshot(page, "dashboard-load-plan-refused")
        page.fill("[data-testid=run-lr]", "abc")
        page.wait_for_function(VALID, timeout=20_000)
        page.click("[data-testid=submit-run]")
        error = page.locator("[data-testid='submit-error-run.learning_rate']")
        error.wait_for(timeout=10_000)
        assert "number" in error.inner_text()
        assert "None" not in error.inner_text()
    assert len(api.get("/api/plans").json()) == plans_before


def test_the_plans_page_lists_stored_plans_and_opens_one_in_the_planner(api_server, api):
    from tests.tiny import tiny_plan

    r = api.post("/api/plans", json={"name": "listed-plan", **tiny_plan(sp_size=2)})
    assert r.status_code == 201, r.text
    plan_id = r.json()["id"]
    with chromium_page() as page:
        page.goto(f"{api_server}/#/plans")
        row = page.locator(f"[data-testid=plan-row-{plan_id}]")
        row.wait_for(timeout=20_000)
        assert "listed-plan" in row.inner_text()
        assert "fits" in row.inner_text()
        page.click(f"[data-testid=plan-open-{plan_id}]")
        page.wait_for_function(VALID, timeout=20_000)
        assert page.input_value("[data-testid=input-sp_size]") == "2"
