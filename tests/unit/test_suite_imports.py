"""The suite's own wiring: Playwright is loaded by a test that opens a page, not by the shared conftest or by the
modules outside tests/e2e that import tests.e2e.browser (a unit test process never pays for it)."""
from __future__ import annotations

import subprocess
import sys

from tests.services import REPO


def test_the_conftest_and_the_browser_helpers_do_not_import_playwright():
    code = ("import sys, tests.conftest, tests.e2e.browser, tests.integration.test_exports_run; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'playwright'))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]", r.stdout
