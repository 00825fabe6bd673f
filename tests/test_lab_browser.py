"""The JupyterLab extension (labextension/) in a real browser, under a real hub.

Debian's Chromium (``/usr/bin/chromium``, from ``scripts/install-system.sh``) driven by
Playwright (never ``playwright install``): alice logs in to the hub of ``tests/test_spawner.py``
(4 H100, her queue's limit is 4 GPUs), her server starts with 2 GPUs and serves JupyterLab; the
status bar shows her GPUs; a 4-GPU batch job she submits waits in the queue; the side panel shows
it, cancels it, and it goes; her server's job shows the GPU utilization its monitor reported;
she sees no reaper settings (not an admin); a reaper warning and a pre-emption notice posted to
her server appear as notifications, and after her server restarts (its notices numbered from 1
again) the next warning appears too. Then admin (role gpusched-admin: the scheduler's admin) opens
the panel of his server, sees the reaper's timeouts, changes one (the service then reports it)
and gets the service's error for a bad one. A CPU-only server (the demo's gpus: 0 profile) says
"CPU only" in the status bar and "no GPU" in the panel. Screenshots go to
``test-output/lab-browser/`` for a person to look at.

Skips when /usr/bin/chromium or Playwright is missing, or the extension was not built
(``make labextension``; ``make test`` does all three).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import hub_harness
import pytest
import requests
from browser_helpers import TIMEOUT_MS, browser_fixture, log_in, sync_api  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "test-output" / "lab-browser"
BUILT = ROOT / "jupyter_gpusched" / "labextension" / "package.json"
USER = "alice"
ADMIN = "admin"  # hub_config's demo admin: role gpusched-admin, an admin of the scheduler

if not BUILT.exists():
    pytest.skip("the lab extension is not built: run `make labextension`", allow_module_level=True)

from test_spawner import (  # noqa: E402 (after the skips)
    HubRunner,
    start_server,
    stop_every_server,
    wait_free,
)

_no_news = hub_harness.no_news


@pytest.fixture(scope="module")
def lab_hub():
    if not hub_harness.CHP.exists():
        pytest.skip("node_modules/.bin/configurable-http-proxy is missing: run `make node_modules`")
    hub_harness._create_demo_users()
    runner = HubRunner()
    # the demo's simulated GPUs, chosen explicitly (there is no fallback to them: docs/gpu.md)
    runner.env.update(
        GPUSCHED_GPU_BACKEND="simulated", GPUSCHED_SIM_CLUSTER=runner.env["GPUSCHED_CLUSTER_FILE"]
    )
    failed = True
    try:
        hub = runner.start()
        yield runner
        failed = False
    finally:
        with contextlib.suppress(Exception):
            stop_every_server(runner.hub)
        left = hub_harness._stop(runner.hub) if runner.hub else []
        if left or failed:
            print(f"--- {runner.hub.log_path} (tail) ---\n{runner.hub.log_tail(200)}")
        elif not os.environ.get("GPUSCHED_KEEP_HUB_STATE"):
            hub_harness.remove_state(runner.state_dir)
    assert not left, "processes left after the hub stopped:\n" + "\n".join(left)
    del hub


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


def _post_notice(hub, body: dict) -> dict:
    response = requests.post(
        f"{hub.url}/user/{USER}/gpusched/api/notices",
        json=body,
        headers={"Authorization": f"token {hub.token(USER)}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()


def _toast(page, text: str):
    """A JupyterLab notification (toast) whose text contains ``text``."""
    return page.locator(".jp-toast-message", has_text=text)


_log_in = log_in  # (test_queued_stop_browser.py imports it from here)


# Every visible element of the panel whose content is wider than its box, or that reaches past
# the panel's right edge (the panel hides horizontal overflow: that is what a user sees clipped).
_CLIPPED = """panel => {
  const edge = panel.getBoundingClientRect().right;
  const clipped = [];
  if (panel.scrollWidth > panel.clientWidth + 1) {
    clipped.push(`the panel: ${panel.scrollWidth} > ${panel.clientWidth} px`);
  }
  for (const node of panel.querySelectorAll('*')) {
    const box = node.getBoundingClientRect();
    if (!box.width || !node.getClientRects().length) continue; // hidden
    const text = (node.textContent || node.getAttribute('class') || '').trim().slice(0, 40);
    if (node.clientWidth && node.scrollWidth > node.clientWidth + 1) {
      clipped.push(`${node.tagName} "${text}": ${node.scrollWidth} > ${node.clientWidth} px`);
    } else if (box.right > edge + 1) {
      clipped.push(`${node.tagName} "${text}": right edge ${box.right} > ${edge}`);
    }
  }
  return {width: panel.clientWidth, clipped};
}"""


def _assert_nothing_clipped(panel) -> None:
    measured = panel.evaluate(_CLIPPED)
    assert measured["width"] < 400, measured  # the default side bar width, not a widened one
    assert measured["clipped"] == [], measured


def test_status_bar_panel_cancel_and_notices(lab_hub, browser):
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, USER)
    start_server(hub, USER, "gpu-2")
    token = hub.token(USER)

    # the proxy endpoints the panel reads, through the hub's proxy as alice
    status = requests.get(
        f"{hub.url}/user/{USER}/gpusched/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=20,
    ).json()
    assert status["configured"] and status["gpus"] == 2 and status["gpu_model"] == "H100", status
    assert status["job"]["state"] == "running", status

    page = _log_in(browser, hub, USER)
    page.goto(f"{hub.url}/user/{USER}/lab")
    item = page.locator(".jp-gpusched-status")
    sync_api.expect(item).to_contain_text("2x H100", timeout=TIMEOUT_MS)
    _shot(page, "1-status-bar")

    # a batch job alice cannot start now (her 2 GPUs + 4 > her queue's limit of 4): it queues
    response = hub.service(
        "POST",
        "api/jobs",
        token,
        json={"command": "sleep 600", "gpus": 4, "name": "big-run", "deadline": "2d"},
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "pending", job

    item.click()  # opens the panel, at the right side bar's default width
    panel = page.locator("#jp-gpusched-panel")
    sync_api.expect(panel).to_be_visible()
    row = panel.locator(f'.jp-gpusched-job[data-job-id="{job["id"]}"]')
    sync_api.expect(row).to_contain_text("pending")
    # when it must have finished, as the scheduler's page says it (the time: Chromium's clock)
    due = row.locator(".jp-gpusched-deadline")
    # (two days ahead: with its date, as "18:32" alone would read as today)
    sync_api.expect(due).to_have_text(re.compile(r"^due by \d{4}-\d\d-\d\d \d\d:\d\d$"))
    sync_api.expect(due).to_have_attribute("title", re.compile(r"\d{4}"))
    queue_row = panel.locator(f'[data-queue-job="{job["id"]}"]')
    sync_api.expect(queue_row).to_contain_text("mine")
    sync_api.expect(panel.locator(".jp-gpusched-node")).to_contain_text("gpu1")
    sync_api.expect(item).to_contain_text("big-run: queued #1", timeout=TIMEOUT_MS)
    # why it waits: the service's message in full, its family as a small tag
    view = hub.service("GET", f"api/jobs/{job['id']}", token).json()
    reason = view["reason"]
    assert len(reason["message"]) > len(reason["family"]), reason
    # what the scheduler plans it to run, under the reason: no walltime, so the default
    assert view["planned_run_time"]["from"] == "default", view
    sync_api.expect(row.locator(".jp-gpusched-planned")).to_have_text(
        view["planned_run_time"]["message"]
    )
    for pending in (row, queue_row):
        sync_api.expect(pending.locator(".jp-gpusched-reason-message")).to_have_text(
            reason["message"]
        )
        sync_api.expect(pending.locator(".jp-gpusched-tag")).to_contain_text([reason["family"]])
    # "This server": her server's job only, not the batch job waiting beside it
    mine = panel.locator(".jp-gpusched-mine")
    sync_api.expect(mine).to_have_attribute("data-job-id", status["job_id"])
    sync_api.expect(mine).to_contain_text("2x H100")
    sync_api.expect(mine).not_to_contain_text("queued")
    sync_api.expect(mine).not_to_contain_text(reason["family"])
    # her server's recent GPU utilization, a line that grows at each refresh
    sync_api.expect(mine.locator(".jp-gpusched-spark svg path")).to_have_attribute(
        "d", re.compile(r"^M[\d.]+,[\d.]+ L"), timeout=TIMEOUT_MS
    )
    # her queues as the service counts them (api/me): in use against guarantee and limit
    me = hub.service("GET", "api/me", token).json()
    assert me["queues"], me
    for queue in me["queues"]:
        block = panel.locator(f'.jp-gpusched-myqueue[data-queue="{queue["path"]}"]')
        limit = "no limit" if queue["limit"] is None else f"limit {queue['limit']:g}"
        sync_api.expect(block).to_contain_text(
            f"{queue['in_use']:g} in use · {queue['guaranteed']:g} guaranteed · {limit}"
        )
        sync_api.expect(block.locator(".jp-gpusched-bar")).to_be_visible()
        share = queue["fair_share"]  # where it stands, as the page says it
        sync_api.expect(block.locator(".jp-gpusched-fair-share")).to_have_text(
            "fair-share order not computed yet"
            if share is None
            else f"{_ordinal(share['rank'])} of {share['of']} in the fair-share order"
        )
    # the cluster over the last 24 h (api/history, through her server), as on the page
    history = hub.service("GET", "api/history", token).json()
    assert history["rows"], history
    total = history["rows"][-1]["total_gpus"]
    sync_api.expect(panel.locator(".jp-gpusched-cluster .jp-gpusched-spark")).to_contain_text(
        re.compile(rf"^ allocated, last 24 h \(\d+ of {total} at \d\d:\d\d\)$")
    )
    # her GPUs marked in the cluster's grid: the 2 of her server
    sync_api.expect(panel.locator(".jp-gpusched-node .jp-gpusched-gpu-mine")).to_have_count(2)
    # the link to the scheduler's page, as the hub's proxy serves it
    assert status["page_url"] == "/services/gpusched/", status
    link = panel.locator("a.jp-gpusched-page-link")
    sync_api.expect(link).to_have_attribute("href", status["page_url"])
    _assert_nothing_clipped(panel)
    # her server's own job: the GPU utilization its monitor reported (simulated GPUs: 0%)
    server_row = panel.locator(f'.jp-gpusched-job[data-job-id="{status["job_id"]}"]')
    sync_api.expect(server_row.locator(".jp-gpusched-util")).to_have_text(
        re.compile(r"^GPU \d+%$"), timeout=TIMEOUT_MS
    )
    sync_api.expect(row.locator(".jp-gpusched-util")).to_have_text("GPU \u2014")  # pending
    # not an admin: no reaper settings
    sync_api.expect(panel.locator(".jp-gpusched-reaper")).to_be_hidden()
    assert panel.locator(".jp-gpusched-reaper-input:visible").count() == 0
    _shot(page, "2-panel-queued")
    panel.screenshot(path=str(SHOTS / "panel.png"))  # docs/panel.png is a copy of it

    # a cancel is asked first, in the page's words; kept, nothing happens
    row.locator(".jp-gpusched-cancel").click()
    dialog = page.locator(".jp-Dialog")
    sync_api.expect(dialog).to_contain_text(f"Cancel {job['id']} (big-run)? It leaves the queue.")
    dialog.get_by_role("button", name="Keep it").click()
    sync_api.expect(dialog).to_have_count(0)
    assert hub.service("GET", f"api/jobs/{job['id']}", token).json()["state"] == "pending"
    row.locator(".jp-gpusched-cancel").click()
    page.locator(".jp-Dialog").get_by_role("button", name="Cancel it").click()
    sync_api.expect(row).to_have_count(0)
    assert hub.service("GET", f"api/jobs/{job['id']}", token).json()["state"] == "cancelled"
    _shot(page, "3-panel-cancelled")

    # a job array: one block in "My jobs" and one entry in the queue, cancelled as one
    response = hub.service(
        "POST",
        "api/jobs",
        token,
        json={"command": "sleep 600", "gpus": 1, "name": "sweep", "array": "0-2%1"},
    )
    assert response.status_code == 201, response.text
    array_id = response.json()["array_id"]
    block = panel.locator(f'.jp-gpusched-array[data-array-id="{array_id}"]')
    queue = hub.service("GET", "api/queue", token).json()
    name = queue["arrays"][array_id]  # Slurm's a-N_[1-2%1]: the CLI's and the page's name too
    sync_api.expect(block).to_contain_text(
        f"{name} sweep: array of 3 jobs, 1 running, 2 pending", timeout=TIMEOUT_MS
    )
    reason = queue["jobs"][0]["reason"]
    sync_api.expect(block.locator(".jp-gpusched-reason-message")).to_have_text(reason["message"])
    # the next element to start, first in line (api/jobs lists the newest first)
    first = min(j["position"] for j in queue["jobs"] if j.get("array_id") == array_id)
    sync_api.expect(block).to_contain_text(f"first waiting queued #{first + 1}")
    sync_api.expect(panel.locator(".jp-gpusched-job", has_text="sweep")).to_have_count(1)
    entry = panel.locator(f'[data-queue-array="{array_id}"]')
    sync_api.expect(entry).to_contain_text(f"{name}, 2 waiting")
    _assert_nothing_clipped(panel)
    block.locator(".jp-gpusched-cancel").click()
    dialog = page.locator(".jp-Dialog")
    sync_api.expect(dialog).to_contain_text(
        f"Cancel {name}? Its 2 pending jobs leave the queue; its 1 running job gets the stop "
        "signal."
    )
    dialog.get_by_role("button", name="Cancel it").click()
    sync_api.expect(block).to_have_count(0, timeout=TIMEOUT_MS)
    states = {
        j["state"]
        for j in hub.service("GET", "api/jobs", token).json()["jobs"]
        if j.get("array_id") == array_id
    }
    assert states == {"cancelled"}, states

    # notices from the scheduler: a reaper warning, then a pre-emption
    deadline = time.time() + 600
    idle = {"kind": "idle", "message": "Your GPUs have been idle for 50 min", "deadline": deadline}
    _post_notice(hub, idle)
    _post_notice(
        hub, {"kind": "preemption", "message": "A tier-1 job needs your GPUs", "deadline": None}
    )
    # the extension asks for notices every 10 s: wait longer than expect's 5 s default
    sync_api.expect(_toast(page, "Idle server: Your GPUs have been idle")).to_be_visible(
        timeout=TIMEOUT_MS
    )
    sync_api.expect(_toast(page, "Pre-emption: A tier-1 job needs your GPUs")).to_be_visible(
        timeout=TIMEOUT_MS
    )
    page.wait_for_timeout(1500)  # the toasts slide in
    _shot(page, "4-notifications")
    page.close()
    stop_every_server(hub)
    wait_free(hub, 4, timeout=15)


def test_every_warning_shows_once_per_server_start(lab_hub, browser):
    """A server numbers its notices from 1 at each start: a user warned (and culled) once still
    sees the next server's first warning; a reload does not show a warning again."""
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, USER)
    start_server(hub, USER, "gpu-1")
    page = _log_in(browser, hub, USER)
    lab = f"{hub.url}/user/{USER}/lab"
    page.goto(lab)
    first = _post_notice(hub, {"kind": "idle", "message": "first warning", "deadline": None})
    sync_api.expect(_toast(page, "Idle server: first warning")).to_be_visible(
        timeout=TIMEOUT_MS  # the extension asks every 10 s
    )

    page.reload()  # the same server start: the first warning was shown, the second is new
    _post_notice(hub, {"kind": "idle", "message": "second warning", "deadline": None})
    sync_api.expect(_toast(page, "Idle server: second warning")).to_be_visible(
        timeout=TIMEOUT_MS  # the extension asks every 10 s
    )
    # one check of the notices showed the second: the first was in it and stayed hidden
    assert _toast(page, "Idle server: first warning").count() == 0

    stop_every_server(hub)  # as the reaper's cull does; then the user starts again
    wait_free(hub, 4, timeout=15)
    start_server(hub, USER, "gpu-1")
    page.goto(lab)
    third = _post_notice(hub, {"kind": "idle", "message": "third warning", "deadline": None})
    assert third["id"] == first["id"] == 1  # numbered from 1 again: the id alone cannot tell
    sync_api.expect(_toast(page, "Idle server: third warning")).to_be_visible(
        timeout=TIMEOUT_MS  # the extension asks every 10 s
    )
    assert third["start"] != first["start"]
    _shot(page, "7-warning-after-a-server-restart")
    page.close()
    stop_every_server(hub)
    wait_free(hub, 4, timeout=15)


def test_a_cpu_only_server_says_cpu_only_not_0_gpus(lab_hub, browser):
    """A server of the demo's gpus: 0 profile: the status bar says "CPU only" and its row in
    the panel "no GPU", never "0x GPU" or "0 GPUs", and no GPU utilization."""
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, USER)
    start_server(hub, USER, "cpu-only")
    status = requests.get(
        f"{hub.url}/user/{USER}/gpusched/api/status",
        headers={"Authorization": f"token {hub.token(USER)}"},
        timeout=20,
    ).json()
    assert status["gpus"] == 0 and status["job"]["state"] == "running", status
    page = _log_in(browser, hub, USER)
    page.goto(f"{hub.url}/user/{USER}/lab")
    item = page.locator(".jp-gpusched-status")
    sync_api.expect(item).to_have_text(re.compile(r"^CPU only( · |$)"), timeout=TIMEOUT_MS)
    sync_api.expect(item).not_to_contain_text("GPU")
    item.click()
    panel = page.locator("#jp-gpusched-panel")
    row = panel.locator(f'.jp-gpusched-job[data-job-id="{status["job_id"]}"]')
    node = status["job"]["allocation"][0]["node"]
    sync_api.expect(row).to_contain_text(f"no GPU · {node}")
    sync_api.expect(row).not_to_contain_text("0 GPU")
    sync_api.expect(row).not_to_contain_text(f"{node}:")
    assert row.locator(".jp-gpusched-util").count() == 0
    mine = panel.locator(".jp-gpusched-mine")
    sync_api.expect(mine).to_contain_text("CPU only")
    sync_api.expect(mine).not_to_contain_text("idle GPUs")
    _shot(page, "8-cpu-only-server")
    page.close()
    stop_every_server(hub)
    wait_free(hub, 4, timeout=15)


def test_an_admin_edits_the_reaper_timeouts_in_the_panel(lab_hub, browser):
    hub = lab_hub.hub
    _no_news(lab_hub.state_dir, ADMIN)
    start_server(hub, ADMIN, "gpu-2")
    token = hub.token(ADMIN)
    # alice's job waits (her queue's limit is 4: 4 GPUs of 4 are free, 2 are admin's)
    other = hub.service(
        "POST", "api/jobs", hub.token(USER), json={"command": "sleep 600", "gpus": 4}
    )
    assert other.status_code == 201, other.text
    other = other.json()
    before = hub.service("GET", "api/reaper", token).json()["settings"]
    assert before["timeout_tier_3"] == 1800, before

    page = _log_in(browser, hub, ADMIN)
    page.goto(f"{hub.url}/user/{ADMIN}/lab")
    item = page.locator(".jp-gpusched-status")
    sync_api.expect(item).to_contain_text("2x H100", timeout=TIMEOUT_MS)
    item.click()
    panel = page.locator("#jp-gpusched-panel")
    reaper = panel.locator(".jp-gpusched-reaper")
    sync_api.expect(reaper).to_be_visible()
    # "My jobs" and the status bar are his own, though an admin's api/jobs lists everybody's:
    # alice's job is in the queue (hers, named), not in his jobs
    sync_api.expect(panel.locator(".jp-gpusched-jobs .jp-gpusched-job")).to_have_count(1)
    sync_api.expect(panel.locator(".jp-gpusched-queue")).to_contain_text(USER)
    assert panel.locator(f'.jp-gpusched-jobs [data-job-id="{other["id"]}"]').count() == 0
    sync_api.expect(item).not_to_contain_text("queued")
    assert hub.service("DELETE", f"api/jobs/{other['id']}", hub.token(USER)).status_code == 200
    # a profile's own timeout wins over its tier's: the editor names those it does not reach
    profiles = reaper.locator(".jp-gpusched-reaper-profiles")
    before_profiles = before["profile_timeouts"]
    try:
        changed = {"profile_timeouts": {**before_profiles, "t2-short": 600}}
        assert hub.service("PUT", "api/reaper", token, json=changed).status_code == 200
        sync_api.expect(profiles).to_contain_text(
            "A profile's own timeout wins over its tier's:", timeout=TIMEOUT_MS
        )
        sync_api.expect(profiles).to_contain_text("t2-short 10 min", timeout=TIMEOUT_MS)
    finally:
        hub.service("PUT", "api/reaper", token, json={"profile_timeouts": before_profiles})
    tier3 = reaper.locator('input[data-setting="timeout_tier_3"]')
    sync_api.expect(tier3).to_have_value("30")  # minutes
    sync_api.expect(reaper.locator('input[data-setting="timeout_tier_1"]')).to_have_value("off")

    tier3.fill("12")
    page.wait_for_timeout(6000)  # a refresh of the panel comes and goes: the edit stays
    sync_api.expect(tier3).to_have_value("12")
    reaper.locator(".jp-gpusched-reaper-save").click()
    saved = reaper.locator(".jp-gpusched-reaper-message")
    sync_api.expect(saved).to_have_text("Saved: tier 3 timeout")  # the editor's words
    settings = hub.service("GET", "api/reaper", token).json()["settings"]
    assert settings["timeout_tier_3"] == 720, settings  # what the service now reports
    assert settings["timeout_tier_2"] == before["timeout_tier_2"]  # only what was changed
    _shot(page, "5-admin-reaper-saved")

    # his own server is tier 2: a new tier-2 timeout shows in the status bar at once, not at
    # the status bar's next poll (every 15 s)
    reclaim = re.compile(r"idle reclaim in (\d+) min")
    sync_api.expect(item).to_contain_text(reclaim, timeout=TIMEOUT_MS)
    assert int(reclaim.search(item.inner_text()).group(1)) > 30  # the default: 45 min
    reaper.locator('input[data-setting="timeout_tier_2"]').fill("20")
    reaper.locator(".jp-gpusched-reaper-save").click()
    sync_api.expect(item).to_contain_text(re.compile(r"idle reclaim in (19|20) min"), timeout=2500)

    tier3.fill("soon")
    reaper.locator(".jp-gpusched-reaper-save").click()
    message = reaper.locator(".jp-gpusched-reaper-message")
    sync_api.expect(message).to_contain_text('Not saved: "tier 3 timeout" must be a duration')
    sync_api.expect(message).not_to_contain_text("timeout_tier_3")  # not the API's name
    sync_api.expect(message).not_to_contain_text("JSON")
    assert hub.service("GET", "api/reaper", token).json()["settings"]["timeout_tier_3"] == 720
    _shot(page, "6-admin-reaper-error")

    page.close()
    response = hub.service(
        "PUT",
        "api/reaper",
        token,
        json={"timeout_tier_3": 1800, "timeout_tier_2": before["timeout_tier_2"]},
    )
    assert response.status_code == 200, response.text
    stop_every_server(hub)
    wait_free(hub, 4, timeout=15)
