"""Debian's Chromium driven by Playwright (Playwright's own browser download is not possible here)."""
from __future__ import annotations

import atexit
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tests.services import REPO

if TYPE_CHECKING:  # Playwright itself loads with the first page (a test session without pages never imports it)
    from playwright.sync_api import Browser, Playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-quic", "--no-first-run",
        "--disable-component-update", "--disable-sync"]
ARTIFACTS = REPO / "test-artifacts"
COOKIE = "ulab_token"  # what the dashboard's sign-in (POST /api/session) sets
_default_sign_in: tuple[str, str] | None = None
# Run in a page: from then on window.__arrivals collects [points on the loss chart, Date.now()] at each change.
WATCH_LOSS_CHART = """() => {
  window.__arrivals = [];
  const el = document.querySelector('[data-testid=loss-chart]');
  new MutationObserver(() => window.__arrivals.push([Number(el.dataset.points), Date.now()]))
    .observe(el, {attributes: true, attributeFilter: ['data-points']});
}"""


def sign_in_by_default(base_url: str, token: str) -> None:
    """Pages opened after this carry the token's session cookie for base_url."""
    global _default_sign_in
    _default_sign_in = (base_url, token)


_running: tuple[Playwright, Browser] | None = None


def _browser() -> Browser:
    """One Chromium per test process, started on first use and closed at exit: each page gets a fresh context
    (its own cookies and storage), which isolates tests as a new browser would, without a browser start each."""
    global _running
    if _running is None or not _running[1].is_connected():
        stop_browser()  # a browser that went away: its Playwright driver goes too
        from playwright.sync_api import sync_playwright

        playwright = sync_playwright().start()
        _running = (playwright, playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True))
        atexit.register(stop_browser)
    return _running[1]


def stop_browser() -> None:
    global _running
    if _running is not None:
        playwright, browser = _running
        _running = None
        if browser.is_connected():
            browser.close()
        playwright.stop()


@contextmanager
def chromium_page(width: int = 1280, height: int = 800, signed_in: bool = True, enforce_csp: bool = False,
                  color_scheme: Literal["light", "dark"] = "light"):
    """A page in a fresh context. The dashboard's CSP forbids eval, which Playwright's string predicates use, so
    tests bypass it unless `enforce_csp` (tests/e2e/test_dashboard_headers.py checks the pages under it).
    `color_scheme` is what prefers-color-scheme answers ("light" or "dark")."""
    context = _browser().new_context(viewport={"width": width, "height": height}, bypass_csp=not enforce_csp,
                                     color_scheme=color_scheme)
    try:
        if signed_in and _default_sign_in:
            url, token = _default_sign_in
            context.add_cookies([{"name": COOKIE, "value": token, "url": url, "httpOnly": True,
                                  "sameSite": "Strict"}])
        yield context.new_page()
    finally:
        context.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


# docs/screenshots/ is tracked: a test run refreshes it only when asked, so `make test` leaves the tree clean
DOC_SCREENSHOTS_ENV = "ULAB_DOC_SCREENSHOTS"


def to_docs(shot: Path, name: str) -> Path | None:
    """Copy a test's screenshot over docs/screenshots/NAME when ULAB_DOC_SCREENSHOTS=1 (answers the copy)."""
    if os.environ.get(DOC_SCREENSHOTS_ENV) != "1":
        return None
    return Path(shutil.copy(shot, REPO / "docs" / "screenshots" / name))
