"""What the Lab says before its server goes: a long reaper warning, whole, and the reaper's cull,
in Debian's Chromium under a real hub (the hub, fixtures and helpers of test_lab_browser.py).

* JupyterLab cuts a toast at 140 characters: the reaper's warning (with its deadline) is longer,
  so the toast says what happens and when, without an ellipsis, and Details opens the whole text;
  the panel's "This server" shows it whole too;
* a real cull (an admin lowers the tier-2 timeout under alice's idle server): the dialog "The
  idle reaper is stopping this server", with the reaper's reason, appears while JupyterLab still
  has its connection, in place of the warning's toast, with the status bar's countdown at the
  lowered timeout; JupyterLab's own "server unavailable" dialog comes only after it.

Screenshots go to ``test-output/lab-browser/`` (``n*-``).
"""

from __future__ import annotations

import re
import time

from test_lab_browser import (  # the module-level skips (no Chromium, no build) apply here too
    ADMIN,
    TIMEOUT_MS,
    USER,
    _log_in,
    _no_news,
    _post_notice,
    _shot,
    _toast,
    browser_fixture,  # noqa: F401 (the fixture "browser")
    lab_hub,  # noqa: F401 (a fixture: this module's own hub)
    sync_api,
)
from test_spawner import start_server, stop_every_server, wait_free

# what the reaper's warning says (service/reaper.py _warn), with a deadline: over 140 characters
WARNING = (
    "This server's GPUs have been idle since 12:34:56 UTC. It will be stopped in 10 min unless "
    "its GPUs are used; save your work."
)


def _open_lab(browser, hub, user):
    page = _log_in(browser, hub, user)
    page.goto(f"{hub.url}/user/{user}/lab")
    sync_api.expect(page.locator(".jp-gpusched-status")).to_contain_text(
        "2x H100", timeout=TIMEOUT_MS
    )
    return page


def test_a_long_warning_is_shown_whole(lab_hub, browser):  # noqa: F811
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, USER)
    start_server(hub, USER, "gpu-2")
    page = _open_lab(browser, hub, USER)
    deadline = time.time() + 600
    _post_notice(hub, {"kind": "idle", "message": WARNING, "deadline": deadline})

    toast = _toast(page, "Idle server:")
    sync_api.expect(toast).to_be_visible(timeout=TIMEOUT_MS)
    text = toast.inner_text()
    assert not text.rstrip().endswith("\u2026"), text  # not cut by JupyterLab
    assert len(text) <= 140 and "will be stopped at" in text and "See Details" in text, text
    assert re.search(r"stopped at \d\d:\d\d:\d\d unless", text), text  # to the second
    page.get_by_role("button", name="Details").click()
    dialog = page.locator(".jp-gpusched-notice-dialog")
    sync_api.expect(dialog).to_contain_text(WARNING)
    _shot(page, "n1-warning-details")
    page.get_by_role("button", name="OK").click()
    sync_api.expect(dialog).to_have_count(0)
    sync_api.expect(toast).to_be_visible()  # Details leaves the toast in place

    page.locator(".jp-gpusched-status").click()
    last = page.locator("#jp-gpusched-panel .jp-gpusched-last-notice")
    sync_api.expect(last).to_contain_text(WARNING, timeout=TIMEOUT_MS)
    page.close()
    stop_every_server(hub)
    wait_free(hub, 4, timeout=15)


def test_the_cull_is_explained_before_the_connection_drops(lab_hub, browser):  # noqa: F811
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, USER)
    admin = hub.token(ADMIN)
    before = hub.service("GET", "api/reaper", admin).json()["settings"]
    start_server(hub, USER, "gpu-2")  # tier 2; the simulated GPUs stay idle
    page = _open_lab(browser, hub, USER)
    try:
        response = hub.service(
            "PUT", "api/reaper", admin, json={"timeout_tier_2": 20, "warning_lead": 10}
        )
        assert response.status_code == 200, response.text
        # the warning first: its toast, and the status bar read again at once, at the lowered
        # timeout (it said 45 min, the tier's timeout before the admin's change)
        warning = _toast(page, "Idle server:")
        sync_api.expect(warning).to_be_visible(timeout=90_000)
        sync_api.expect(page.locator(".jp-gpusched-status")).to_contain_text(
            re.compile(r"idle reclaim in [01] min"), timeout=5_000
        )
        cull = page.locator(".jp-gpusched-cull-dialog")
        sync_api.expect(cull).to_be_visible(timeout=90_000)
        sync_api.expect(page.locator(".jp-Dialog-header")).to_contain_text(
            ["The idle reaper is stopping this server"]
        )
        sync_api.expect(cull).to_contain_text("reaper")
        sync_api.expect(cull).to_contain_text("idle")
        # JupyterLab has not yet said its server is gone
        assert page.get_by_text("Server unavailable").count() == 0
        sync_api.expect(warning).to_have_count(0)  # the dialog took the warning's place
        _shot(page, "n2-cull-dialog")
        page.get_by_role("button", name="OK").click()
        # ... and says it only after (its dialog waits behind ours)
        sync_api.expect(page.get_by_text("Server unavailable")).to_be_visible(timeout=TIMEOUT_MS)
        _shot(page, "n3-then-server-unavailable")
    finally:
        page.close()
        keep = {k: before[k] for k in ("timeout_tier_2", "warning_lead")}
        hub.service("PUT", "api/reaper", admin, json=keep)
        stop_every_server(hub)
        wait_free(hub, 4, timeout=15)
