"""Stop Server on a start waiting in the scheduler's queue, in Chromium, under a real hub.

The hub of ``tests/test_lab_browser.py`` (``lab_hub``: 4 H100, the demo's profiles plus the test
ones). bob's batch job holds all four GPUs; alice starts a server from the hub's spawn form: the
spawn pending page shows her position in the GPU queue. She clicks "Stop Server" there: her
request leaves the queue (cancelled, no GPUs held), she lands on the hub's home page with "Start
My Server", and a new start works once the GPUs are free. Then the same from the home page's
"Stop My Server" while the start is queued. Screenshots in ``test-output/lab-browser/``.
"""

from __future__ import annotations

import time

import pytest
from test_lab_browser import (  # noqa: F401 (fixtures)
    TIMEOUT_MS,
    _log_in,
    _shot,
    browser_fixture,
    lab_hub,
    sync_api,
)
from test_spawner import (
    Progress,
    hold_gpus,
    servers_of,
    stop_server,
    wait_free,
    wait_gone,
    wait_job,
    wait_ready,
)

USER = "alice"


def _queued_job(hub) -> dict:
    """alice's pending notebook job (there is one at a time here)."""
    deadline = time.monotonic() + 30
    while True:
        jobs = hub.service("GET", "api/jobs?state=pending", hub.token(USER)).json()["jobs"]
        if jobs:
            (job,) = jobs
            return job
        assert time.monotonic() < deadline, "alice's start never reached the queue"
        time.sleep(0.2)


def _start_queued(page, hub) -> dict:
    page.goto(f"{hub.url}/hub/spawn/{USER}")
    page.check("input[name=profile][value=gpu-1]")
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
    page.wait_for_url("**/hub/spawn-pending/**")
    sync_api.expect(page.locator("#progress-message")).to_contain_text(
        "position 1 in the GPU queue", timeout=TIMEOUT_MS
    )
    job = _queued_job(hub)
    assert job["kind"] == "notebook" and job["state"] == "pending", job
    return job


def _not_queued(hub, job) -> None:
    ended = wait_job(hub, USER, job["id"], {"cancelled"}, timeout=15)
    assert "allocation" not in ended or not ended["allocation"], ended
    queue = hub.service("GET", "api/queue", hub.token("admin")).json()
    assert queue["pending"] == 0, queue


@pytest.mark.parametrize("where", ["pending page", "home page"])
def test_stop_server_on_a_queued_start(lab_hub, browser, where):  # noqa: F811
    hub = lab_hub.hub
    filler = hold_gpus(hub, "bob", 4)
    page = _log_in(browser, hub, USER)
    try:
        job = _start_queued(page, hub)
        _shot(page, f"queued-stop-{where.split()[0]}-1-queued")
        progress = Progress(hub, USER)  # the spawn's event stream, as the page reads it
        progress.wait_for(lambda e: (e.get("gpusched") or {}).get("state") == "pending")
        if where == "pending page":
            page.click("#stop-server-btn")
        else:
            page.goto(f"{hub.url}/hub/home")
            page.click("#stop")
        _not_queued(hub, job)
        progress.join(30)
        # the stream ends with the cancel, never with "ready" (the page would go to the server
        # that never started: JupyterHub's redirect loop)
        assert not any(e.get("ready") for e in progress.events), progress.events
        assert progress.events[-1].get("failed"), progress.events
        wait_gone(hub, USER, timeout=15)
        # where she lands: the home page, Start available, no error page
        page.wait_for_url("**/hub/home", timeout=TIMEOUT_MS)
        sync_api.expect(page.locator("#start")).to_have_text("Start My Server", timeout=TIMEOUT_MS)
        sync_api.expect(page.locator("#stop")).to_be_hidden()
        assert "Redirect loop" not in page.content()
        _shot(page, f"queued-stop-{where.split()[0]}-2-home")
        page.goto(f"{hub.url}/hub/user/{USER}/")  # her server's URL: "not running", no loop
        assert "Redirect loop" not in page.content()

        # a new start works once the GPUs are free
        hub.service("DELETE", f"api/jobs/{filler}", hub.token("bob"))
        wait_free(hub, 4, timeout=15)
        page.goto(f"{hub.url}/hub/home")
        page.click("#start")
        page.check("input[name=profile][value=gpu-1]")
        page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
        page.wait_for_url(f"**/user/{USER}/lab**", timeout=TIMEOUT_MS)
        wait_ready(hub, USER)
        _shot(page, f"queued-stop-{where.split()[0]}-3-started")
    finally:
        page.close()
        for name in list(servers_of(hub, USER)):
            stop_server(hub, USER, name)
        hub.service("DELETE", f"api/jobs/{filler}", hub.token("bob"))
        wait_free(hub, 4, timeout=15)
