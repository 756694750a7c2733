"""The issue's reproduction (issue 28): a real CPU run at lr=10, submitted from the planner's form with its
guardrails (stop_on_nan and stop_on_divergence on by default, every stop_on_* switch shown with its threshold),
diverges; the trainer checks the rule itself at each step end (worker/trainer/guard.py) and stops by step 5 with a
checkpoint, and the run ends `stopped` with the alert as its reason, on the run page and in the run's timeline.
"Resume from here" at lr=10 again diverges again, measured against the new attempt's own steps, and is stopped
again; "Resume from here" at lr=1e-3 from the first stop's checkpoint then trains on to the end: the rules re-arm on
every attempt, and the timeline records each change.

The divergence factor is 3 here, not the default 10: a resume at lr=10 from a model that already diverged starts
near its loss of thousands and grows about 4x over the next 10 steps (seen: 3,228 -> 13,580), which 10x never
catches; 3x does, while the lr=10 first attempt (6.2 -> 1,152 -> 3,916) fires at step 3 either way."""
import re

import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.e2e.test_dashboard_runs import _fill_tiny_plan
from tests.tiny import wait_for

pytestmark = pytest.mark.slow
# The rule fires at step 3 and the trainer stops on that step; the lr=10 resume was stopped at step 12 (seen); the
# good resume trains on to the end (about a minute on this loaded 2-core machine)
STEPS = 30
STOP_BY = 5  # the bound for the lr=10 run
FACTOR = "3"
VALID = "document.querySelector('[data-testid=planner-results]')?.dataset.state === 'valid'"


def test_a_run_at_lr_10_stops_itself_and_a_resume_at_1e_3_trains_on(stack, api, corpus):
    with chromium_page(height=1600) as page:
        page.goto(f"{stack.url}/#/planner")
        page.locator("[data-testid=planner-form]").wait_for(timeout=20_000)
        _fill_tiny_plan(page, sp_size=1)
        page.fill("[data-testid=run-name]", "lr-10")
        page.fill("[data-testid=run-steps]", str(STEPS))
        page.fill("[data-testid=run-lr]", "10")
        page.fill("[data-testid=run-data]", str(corpus))
        page.fill("[data-testid=run-checkpoint_every]", "0")
        page.fill("[data-testid=run-divergence_factor]", FACTOR)
        # every rule that can stop a run is on the form, with its threshold; NaN and divergence stop by default
        assert page.is_checked("[data-testid=run-stop_on_nan]")
        assert page.is_checked("[data-testid=run-stop_on_divergence]")
        for off in ("grad_norm", "throughput", "stall"):
            assert not page.is_checked(f"[data-testid=run-stop_on_{off}]")
        assert [page.input_value(f"[data-testid=run-{t}]") for t in
                ("divergence_factor", "grad_norm_factor", "throughput_floor", "stall_after_s")] == \
            [FACTOR, "10", "0.5", "1800"]
        page.wait_for_function(VALID, timeout=20_000)
        page.locator("[data-testid=run-guardrails]").scroll_into_view_if_needed()
        screenshot(page, "dashboard-submit-guardrails")
        page.click("[data-testid=submit-run]")
        page.wait_for_url(re.compile(r".*#/runs/\d+$"), timeout=20_000)
        run_id = int(page.url.rsplit("/", 1)[1])
        assert api.post(f"/api/runs/{run_id}/approve").status_code == 200

        done = wait_for(api, run_id, {"stopped"}, timeout_s=400)
        stopped_at = done["last_step"]
        print("lr=10:", done["exit_reason"], "last step", stopped_at)
        loss = api.get(f"/api/runs/{run_id}/metrics", params={"name": "loss", "points": 10_000}).json()
        assert stopped_at <= STOP_BY, (stopped_at, loss)
        assert max(loss["series"][0]["step"]) == stopped_at, (stopped_at, loss)
        assert done["exit_reason"].startswith("stopped: "), done["exit_reason"]
        alert = next(a for a in done["alerts"] if a["stopped"])
        assert alert["kind"] in ("loss_diverged", "loss_nan", "grad_norm_nan"), alert
        assert alert["step"] == stopped_at, alert
        assert done["exit_reason"] == f"stopped: loss diverged ({alert['message']})" or alert["kind"] != "loss_diverged"
        page.locator("[data-testid=run-state]").wait_for(timeout=20_000)
        page.wait_for_function("document.querySelector('[data-testid=run-state]')?.textContent.includes('stopped')",
                               timeout=20_000)
        # the state badge follows the stream; the timeline that says why re-reads the run's events after it
        page.wait_for_function("reason => document.body.innerText.includes(reason)", arg=done["exit_reason"],
                               timeout=20_000)
        events = api.get(f"/api/runs/{run_id}/events").json()
        end = events[-1]
        assert end["kind"] == "attempt_ended"
        assert end["state"] == "stopped"
        assert end["message"] == done["exit_reason"]
        screenshot(page, "dashboard-run-diverged")

        # "resume from here" on the checkpoint the stop saved, at lr=10 again: diverges again, stopped again
        ck = api.get(f"/api/runs/{run_id}/checkpoints").json()[0]
        assert ck["step"] == stopped_at, ck
        assert ck["complete"], ck
        ref = f"{ck['stage']}-{ck['step']}"
        resume_at(page, api, run_id, ref, "10", attempt=2)
        again = wait_for(api, run_id, {"stopped"}, timeout_s=400)
        assert again["attempt"] == 2, again
        second = [a for a in again["alerts"] if a["attempt"] == 2 and a["stopped"]]
        assert len(second) == 1, again["alerts"]
        assert second[0]["step"] > stopped_at, again["alerts"]
        assert again["last_step"] == second[0]["step"], (again["last_step"], second)  # stopped on the step it fired
        print("resumed at lr=10:", again["exit_reason"])
        page.wait_for_function("reason => document.body.innerText.includes(reason)", arg=again["exit_reason"],
                               timeout=20_000)
        screenshot(page, "dashboard-resume-diverged-again")

        # "resume from here" on the first stop's checkpoint, at lr=1e-3 (the newer one is moved aside)
        resume_at(page, api, run_id, ref, "1e-3", attempt=3)
        run = api.get(f"/api/runs/{run_id}").json()
        assert run["attempt"] == 3, run
        assert run["spec"]["run"]["learning_rate"] == 1e-3, run
        # it trains on to the end, with no alert of its own, at the new learning rate
        run = wait_for(api, run_id, {"succeeded"}, timeout_s=400)
        assert run["attempt"] == 3
        assert run["last_step"] == STEPS
        # the stop rules re-armed on attempt 3's own steps: a reference kept from attempt 1 would fire at once;
        # a model that trained at lr=10 may still spike its grad norm once (an alert that stops nothing by default)
        assert [a for a in run["alerts"] if a["attempt"] == 3 and a["stopped"]] == [], run["alerts"]
        assert not [a for a in run["alerts"] if a["attempt"] == 3 and a["kind"] in ("loss_diverged", "loss_nan")]
        lr = api.get(f"/api/runs/{run_id}/metrics", params={"name": "lr", "start": ck["step"] + 1}).json()
        assert lr["series"], lr
        assert all(abs(v - 1e-3) < 1e-9 for v in lr["series"][0]["last"]), lr
        page.reload()
        page.wait_for_function("document.querySelectorAll('[data-testid=event-changed]').length == 1",
                               timeout=20_000)
        assert "learning_rate 10.0 -> 0.001" in page.inner_text("[data-testid=event-changed]")
        ended = [e["state"] for e in api.get(f"/api/runs/{run_id}/events").json() if e["kind"] == "attempt_ended"]
        assert ended == ["stopped", "stopped", "succeeded"], ended
        page.wait_for_function("Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) > 0",
                               timeout=20_000)
        screenshot(page, "dashboard-resumed-at-1e-3")


def resume_at(page, api, run_id: int, ref: str, lr: str, attempt: int) -> None:
    """The run page's "Resume from here" on checkpoint `ref` (stage-step) at learning rate `lr`: queues `attempt`."""
    page.click(f"[data-testid=resume-from-{ref}]")
    page.fill("[data-testid=resume-lr]", lr)
    page.click(f"[data-testid=resume-yes-{ref}]")
    page.wait_for_function("n => document.querySelector('[data-testid=run-resume-from]')?.textContent"
                           ".includes(`attempt ${n} `)", arg=attempt, timeout=20_000)
    assert api.get(f"/api/runs/{run_id}").json()["attempt"] == attempt
