"""Sign-in in Chromium: the token link `make run` prints (a right one after a wrong one too), the sign-in form, and
actions shown by role."""
import pytest

from tests.e2e.browser import chromium_page, screenshot
from tests.tiny import submit, tiny_plan

pytestmark = pytest.mark.slow


def test_sign_in_link_and_banner(stack):
    with chromium_page(signed_in=False) as page:
        page.goto(f"{stack.url}/#/runs")
        page.locator("[data-testid=signin-banner]").wait_for(timeout=20_000)
        assert page.locator("[data-testid=whoami]").count() == 0

        page.goto(f"{stack.url}/#/signin?token={stack.admin_token}&next=/runs")
        page.wait_for_url("**#/runs", timeout=20_000)
        who = page.locator("[data-testid=whoami]")
        who.wait_for(timeout=10_000)
        assert who.get_attribute("data-role") == "admin"
        assert stack.admin_token not in page.url
        page.locator("[data-testid=runs-table]").wait_for(timeout=10_000)
        assert page.locator("[data-testid=signin-banner]").count() == 0

        page.click("[data-testid=signout]")
        page.wait_for_url("**#/signin", timeout=10_000)
        page.goto(f"{stack.url}/#/runs")
        page.locator("[data-testid=signin-banner]").wait_for(timeout=20_000)


def test_a_right_link_after_a_wrong_one_in_the_same_tab_signs_in(stack):
    """The hash changes, the page does not reload: the sign-in page must try the second link's token too."""
    with chromium_page(signed_in=False) as page:
        page.goto(f"{stack.url}/#/signin?token=ulab_wrong&next=/runs")
        page.locator("[data-testid=signin-error]").wait_for(timeout=20_000)
        page.goto(f"{stack.url}/#/signin?token={stack.admin_token}&next=/runs")
        page.wait_for_url("**#/runs", timeout=20_000)
        page.locator("[data-testid=whoami]").wait_for(timeout=10_000)
        assert page.locator("[data-testid=whoami]").get_attribute("data-role") == "admin"


def test_a_viewer_sees_no_actions_and_a_bad_token_is_refused(stack, api, corpus):
    run = submit(api, tiny_plan(sp_size=2), {"steps": 5, "data": {"path": str(corpus)}},
                 name="ui-viewer-sees", approve=False)
    with chromium_page(signed_in=False) as page:
        page.goto(f"{stack.url}/#/signin")
        page.fill("[data-testid=signin-token]", "not-a-token")
        page.click("[data-testid=signin-submit]")
        page.locator("[data-testid=signin-error]").wait_for(timeout=10_000)

        page.fill("[data-testid=signin-token]", stack.token("viewer"))
        page.click("[data-testid=signin-submit]")
        page.wait_for_url("**#/planner", timeout=10_000)
        assert page.locator("[data-testid=whoami]").get_attribute("data-role") == "viewer"
        page.locator("[data-testid=submit-not-allowed]").wait_for(timeout=10_000)
        assert page.locator("[data-testid=submit-run]").is_disabled()

        page.goto(f"{stack.url}/#/runs")
        page.locator(f"[data-testid=run-row-{run['id']}]").wait_for(timeout=20_000)
        assert page.locator(f"[data-testid=approve-{run['id']}]").count() == 0
        assert page.locator(f"[data-testid=cancel-{run['id']}]").count() == 0
        screenshot(page, "dashboard-runs-viewer")
    api.post(f"/api/runs/{run['id']}/cancel")
