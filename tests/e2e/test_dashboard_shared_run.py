"""A real CPU run that trains at lr=10 with its divergence stop switched off ends "succeeded" with an open
loss_diverged alert: in Chromium, the runs list and the run page show the alert beside the state, at 1280 px and at
390 px. Its owner makes a share link on the run page; a fresh browser context with no token and no cookie opens it
and sees the run's plan, state, alert and charts, with no button that acts on the run, and its token reads no other
run; once the owner revokes the run's share links, the link opens nothing."""
import pytest

from tests.e2e.browser import chromium_page, screenshot, to_docs
from tests.tiny import submit, tiny_plan, wait_for

pytestmark = pytest.mark.slow
STEPS = 8
# every control of the run page that changes a run, and the panels a share token may not read
ACTIONS = ("[data-testid^=approve-]", "[data-testid^=cancel-]", "[data-testid^=retry-]", "[data-testid^=resubmit-]",
           "[data-testid^=resume-from-]", "[data-testid=run-labels]", "[data-testid=run-checkpoints]",
           "[data-testid=create-share-link]", "[data-testid=revoke-share-links]", "[data-testid=open-in-planner]",
           "[data-testid=log-view]", "[data-testid=run-fix-card]")


@pytest.fixture(scope="module")
def warned_run(api, corpus) -> dict:
    """lr=10, divergence alert on (factor 3) but its stop off: the run trains to the end with the alert open."""
    run = submit(api, tiny_plan(sp_size=1), {"steps": STEPS, "learning_rate": 10.0, "divergence_factor": 3.0,
                                             "stop_on_divergence": False, "data": {"path": str(corpus)}},
                 name="ui-succeeded-with-alert")
    done = wait_for(api, run["id"], {"succeeded"}, timeout_s=400)
    assert done["last_step"] == STEPS, done
    return done


def _alert_text(run: dict) -> str:
    (alert,) = run["open_alerts"]
    return f"alert: loss diverged at step {alert['step']}"


@pytest.mark.parametrize("width", [1280, 390])
def test_a_run_that_succeeded_with_an_open_alert_shows_it_beside_its_state(stack, warned_run, width):
    rid = warned_run["id"]
    assert [(a["kind"], a["stopped"]) for a in warned_run["open_alerts"]] == [("loss_diverged", False)], warned_run
    badge = _alert_text(warned_run)
    with chromium_page(width=width, height=1200) as page:
        page.goto(f"{stack.url}/#/runs")
        row = page.locator(f"[data-testid=run-row-{rid}]")
        row.wait_for(timeout=20_000)
        assert row.get_attribute("data-state") == "succeeded"
        state = page.locator(f"[data-testid=run-state-{rid}]")
        assert state.inner_text().strip() == "succeeded"
        beside = page.locator(f"[data-testid=run-state-{rid}-alert]")
        assert beside.inner_text().strip() == badge
        assert beside.get_attribute("title") == warned_run["open_alerts"][0]["message"]
        # the open alert is said once, beside the state, not again as a closed one
        assert page.locator(f"[data-testid=run-alert-badge-{rid}]").count() == 0
        _on_screen(page, state, width)
        _on_screen(page, beside, width)
        screenshot(page, f"runs-open-alert-{width}")

        page.click(f"[data-testid=run-link-{rid}]")
        page.locator("[data-testid=run-header]").wait_for(timeout=20_000)
        assert page.get_attribute("[data-testid=run-state]", "data-state") == "succeeded"
        assert page.inner_text("[data-testid=run-state-alert]").strip() == badge
        assert page.inner_text("[data-testid=run-alerts]").strip() == warned_run["open_alerts"][0]["message"]
        _on_screen(page, page.locator("[data-testid=run-state]"), width)
        _on_screen(page, page.locator("[data-testid=run-state-alert]"), width)
        page.wait_for_function(f"document.querySelector('[data-testid=loss-chart]')?.dataset.points === '{STEPS}'",
                               timeout=20_000)
        screenshot(page, f"run-open-alert-{width}")


def _on_screen(page, locator, width: int) -> None:
    """Visible, one box (a badge that wraps on a narrow column wraps inside itself, not broken across lines), and
    inside the page's width (nothing pushed off a phone's screen)."""
    assert locator.is_visible()
    assert locator.evaluate("e => e.getClientRects().length") == 1
    box = locator.bounding_box()
    assert box is not None
    assert box["width"] > 0
    assert box["x"] >= 0, box
    assert box["x"] + box["width"] <= width + 0.5, (box, width)
    assert page.evaluate("document.documentElement.scrollWidth") <= width


def test_a_share_link_opens_the_run_read_only_with_no_sign_in_until_revoked(stack, api, corpus, warned_run):
    rid = warned_run["id"]
    other = submit(api, tiny_plan(sp_size=1), {"steps": 3, "data": {"path": str(corpus)}}, name="ui-not-shared",
                   approve=False)["id"]
    with chromium_page(height=1400) as owner:
        owner.goto(f"{stack.url}/#/runs/{rid}?logy=1")
        owner.locator("[data-testid=create-share-link]").click()
        owner.locator("[data-testid=share-link-url]").wait_for(timeout=20_000)
        link = owner.input_value("[data-testid=share-link-url]")
        owner.wait_for_function("document.querySelector('[data-testid=revoke-share-links]')?.dataset.links === '1'",
                                timeout=20_000)
        assert link.startswith(f"{stack.url}/#/runs/{rid}?"), link
        assert "logy=1" in link, link
        assert "share=ulab_share_" in link, link
        token = link.split("share=")[1].split("&")[0]

        for width in (1280, 390):
            with chromium_page(width=width, height=1400, signed_in=False) as page:
                assert page.context.cookies() == []
                page.goto(link)
                page.wait_for_function(
                    f"document.querySelector('[data-testid=loss-chart]')?.dataset.points === '{STEPS}'",
                    timeout=20_000)
                assert page.evaluate("document.cookie") == ""
                assert page.evaluate("localStorage.length + sessionStorage.length") == 0
                assert page.is_visible("[data-testid=shared-view]")
                assert page.get_attribute("[data-testid=run-state]", "data-state") == "succeeded"
                assert page.inner_text("[data-testid=run-state-alert]").strip() == _alert_text(warned_run)
                assert page.get_attribute("[data-testid=loss-chart]", "data-log-y") == "true"  # the view it was
                page.wait_for_function("document.querySelector('[data-testid=lr-chart]')?.dataset.points === "
                                       f"'{STEPS}'", timeout=20_000)
                page.locator("[data-testid=event-attempt_ended]").wait_for(timeout=20_000)  # the outcome
                assert "succeeded" in page.inner_text("[data-testid=event-attempt_ended]")
                assert '"learning_rate": 10' in page.text_content("[data-testid=run-spec]")  # the plan (folded)
                for action in ACTIONS:
                    assert page.locator(action).count() == 0, action
                assert page.locator("[data-testid=signin-banner]").count() == 0
                assert page.locator("[data-testid=nav-planner]").count() == 0
                # the download link carries the token (no header goes with a plain link)
                assert page.get_attribute("[data-testid=download-metrics-csv]", "href") == \
                    f"/api/runs/{rid}/metrics.csv?share={token}"
                # the page's token reads this run only
                statuses = page.evaluate(
                    """([rid, other, token]) => Promise.all([`/api/runs/${rid}`, `/api/runs/${other}`, '/api/runs',
                         '/api/plans', `/api/runs/${rid}/log`].map((u) => fetch(u, {headers:
                         {Authorization: `Bearer ${token}`}}).then((r) => r.status)))""", [rid, other, token])
                assert statuses == [200, 403, 401, 401, 401], statuses
                acted = page.evaluate(
                    """([rid, token]) => Promise.all(['cancel', 'approve', 'retry'].map((a) => fetch(
                         `/api/runs/${rid}/${a}`, {method: 'POST', headers: {Authorization: `Bearer ${token}`}})
                         .then((r) => r.status)))""", [rid, token])
                assert all(s in (401, 403) for s in acted), acted
                assert page.evaluate("document.documentElement.scrollWidth") <= width
                shot = screenshot(page, f"run-shared-{width}")
                to_docs(shot, f"run-shared-{width}.png")

        owner.click("[data-testid=revoke-share-links]")
        owner.locator("[data-testid=share-revoked]").wait_for(timeout=20_000)
        assert owner.inner_text("[data-testid=share-revoked]") == "1 share link revoked"
        owner.locator("[data-testid=revoke-share-links]").wait_for(state="detached", timeout=5_000)
    with chromium_page(signed_in=False) as page:
        page.goto(link)
        page.locator("[data-testid=run-load-error]").wait_for(timeout=20_000)
        assert "revoked or expired" in page.inner_text("[data-testid=run-load-error]")
        assert page.locator("[data-testid=loss-chart]").count() == 0
