"""What the browser tests share: Debian's Chromium driven by Playwright (never ``playwright
install``), and logging in to a test hub (``hub_harness``) as one of its demo users.

Importing this module skips the importing test module where /usr/bin/chromium or Playwright is
missing.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
TIMEOUT_MS = 60_000

if not CHROMIUM.exists():
    pytest.skip(
        "/usr/bin/chromium is missing: run scripts/install-system.sh (apt-get install chromium)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (test extra)")


@contextlib.contextmanager
def launched_chromium():
    """A headless Chromium, closed on the way out."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(name="browser")
def browser_fixture():
    """``browser``: a headless Chromium for one test (import this into a test module to have
    the fixture there)."""
    with launched_chromium() as browser:
        yield browser


def log_in(browser, hub, user: str, width: int = 1400, height: int = 900):
    """A new page of ``browser``, logged in to ``hub`` as ``user`` (its demo password), on the
    hub's home page."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{hub.url}/hub/login")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", hub.password)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/**")
    return page
