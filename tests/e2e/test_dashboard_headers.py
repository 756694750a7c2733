"""The dashboard under its Content-Security-Policy (backend/api/headers.py): the planner and a run page with its
charts work in Chromium with not one policy violation."""
import pytest

from tests.e2e.browser import chromium_page

pytestmark = pytest.mark.slow
# Run before the page's own scripts, in every document the page loads
RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
"""


def test_the_dashboard_runs_under_its_csp_without_a_violation(stack, trained_run):
    with chromium_page(enforce_csp=True) as page:
        console: list[str] = []
        page.on("console", lambda m: console.append(m.text))
        page.add_init_script(RECORD_VIOLATIONS)
        response = page.goto(f"{stack.url}/")
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
        page.locator("text=Planner").first.wait_for(timeout=20_000)
        page.goto(f"{stack.url}/#/runs/{trained_run['id']}")
        # a function, not an expression: Playwright evaluates expressions with eval, which the CSP forbids
        page.wait_for_function("() => Number(document.querySelector('[data-testid=loss-chart]')?.dataset.points) > 0",
                               timeout=20_000)
        assert page.evaluate("window.__csp") == []
        assert not [m for m in console if "Content Security Policy" in m]
