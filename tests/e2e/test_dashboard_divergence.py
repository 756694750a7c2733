"""The issue's reproduction: a real CPU run at lr=10 diverges; the alert raised at ingest stops it
(run.stop_on_divergence) with its reason, shown on the run page, as a badge in the runs list and in the run's
timeline (GET /api/runs/{id}/events)."""
import time

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow


def test_a_run_at_lr_10_is_stopped_and_says_why(stack, api, corpus):
    run = submit(api, tiny_plan(sp_size=1), {"steps": 200, "learning_rate": 10.0, "checkpoint_every": 0,
                                             "stop_on_divergence": True, "data": {"path": str(corpus)}},
                 name="lr-10")
    done = wait_for(api, run["id"], {"cancelled"}, timeout_s=400)
    assert done["exit_reason"].startswith("stopped: "), done["exit_reason"]
    assert done["last_step"] < 200 and done["device"] == "cpu"  # recorded from the trainer's on_gpu point
    kinds = [a["kind"] for a in done["alerts"]]
    assert set(kinds) <= {"loss_diverged", "loss_nan", "grad_norm_nan", "grad_norm_exploded"}, kinds
    assert any(a["stopped"] for a in done["alerts"])
    loss = api.get(f"/api/runs/{run['id']}/metrics", params={"name": "loss"}).json()["series"][0]
    assert max(loss["max"]) > 10 * min(loss["min"])  # the diverged points are stored and charted
    # the timeline (GET /api/runs/{id}/events): submitted, approved, started, the stopping alert, then the end
    events = api.get(f"/api/runs/{run['id']}/events").json()
    assert [e["kind"] for e in events][:3] == ["submitted", "approved", "attempt_started"], events
    alert = next(e for e in events if e["kind"] == "alert" and e["stopped"])
    end = events[-1]
    assert end["kind"] == "attempt_ended" and end["state"] == "cancelled" and end["message"] == done["exit_reason"]
    assert events.index(alert) < events.index(end) and alert["step"] <= end["step"]
    print("lr=10:", done["exit_reason"], "last step", done["last_step"], kinds)
    with chromium_page(height=1000) as page:
        page.goto(f"{stack.url}/#/runs/{run['id']}")
        page.locator("[data-testid=run-alerts]").wait_for(timeout=20_000)
        assert "stopped" in page.inner_text("[data-testid=run-alerts]")
        page.wait_for_function("Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) > 0",
                               timeout=20_000)
        # the timeline card: the stopping alert between the start and the end of the attempt
        page.wait_for_function("document.querySelectorAll('[data-testid=run-timeline] li').length >= 5",
                               timeout=20_000)
        items = page.locator("[data-testid=run-timeline] li").all_inner_texts()
        assert "submitted" in items[0] and "approved" in items[1] and "attempt started #1" in items[2], items
        stopped_item = next(i for i in items if "alert" in i and "stopped the run" in i)
        assert alert["message"] in stopped_item and items.index(stopped_item) < len(items) - 1, items
        assert "attempt ended #1" in items[-1] and "(cancelled)" in items[-1], items
        screenshot(page, "dashboard-run-diverged")
        page.goto(f"{stack.url}/#/runs")
        badge = page.locator(f"[data-testid=run-alert-badge-{run['id']}]")
        badge.wait_for(timeout=20_000)
        assert kinds[0].split("_")[0] in badge.inner_text()

        # "resume from here" on the checkpoint the stop saved: attempt 2 resumes from it (the trainer's launcher says
        # so in the log), then is cancelled
        ck = api.get(f"/api/runs/{run['id']}/checkpoints").json()[0]
        ref = f"{ck['stage']}-{ck['step']}"
        page.goto(f"{stack.url}/#/runs/{run['id']}")
        page.click(f"[data-testid=resume-from-{ref}]")
        assert f"resumes from step {ck['step']}" in page.inner_text(f"[data-testid=resume-confirm-{ref}]")
        page.locator("[data-testid=run-checkpoints]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-resume-from-here")
        page.click(f"[data-testid=resume-yes-{ref}]")
        page.locator("[data-testid=run-resume-from]").wait_for(timeout=20_000)
        again = api.get(f"/api/runs/{run['id']}").json()
        assert again["attempt"] == 2 and again["resume_from"] == f"{ck['stage']}/checkpoint-{ck['step']}", again
    said = f"--resume-from {ck['stage']}/checkpoint-{ck['step']}: 0 newer checkpoint(s) moved aside"
    end = time.monotonic() + 120
    while not any(said in line for line in api.get(f"/api/runs/{run['id']}/log", params={"q": "--resume-from"}
                                                   ).json()["lines"]):
        assert time.monotonic() < end, api.get(f"/api/runs/{run['id']}/log").json()["lines"][-20:]
        time.sleep(0.5)
    api.post(f"/api/runs/{run['id']}/cancel")
    assert wait_for(api, run["id"], {"cancelled", "succeeded"}, timeout_s=120)["attempt"] == 2
