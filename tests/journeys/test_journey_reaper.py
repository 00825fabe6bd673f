"""alice leaves her 1-GPU server idle; admin lowers the idle timeout; alice is warned, then culled,
and reads why.

The spawn form promises the profile's idle timeout and the reaper applies that one. Then admin
lowers it below the time alice has already been idle: she is warned first (the whole warning,
in seconds), never culled in the same second; ``warning_lead`` later the reaper stops her
server, her Lab says so before the connection drops, and the hub's home page she lands on says
that the idle reaper stopped it, and why.
"""

from __future__ import annotations

import re
import time

import test_spawner as ts
from journey import TIMEOUT_MS, jobs_of, service, shot, skip_if_missing, stop_everything, sync_api

skip_if_missing()
expect = sync_api.expect
TEST = "idle-reaper"
WARNING_LEAD = 25  # seconds: longer than the Lab's 10 s poll of its notices


def _session(hub, user: str) -> dict:
    response = service(hub, "GET", "api/reaper", "admin")
    assert response.status_code == 200, response.text
    [session] = [s for s in response.json()["sessions"] if s["user"] == user]
    return session


def _events(hub, user: str, kind: str) -> list[dict]:
    response = service(hub, "GET", f"api/events?kind={kind}&user={user}", "admin")
    assert response.status_code == 200, response.text
    return response.json()["events"]


def _set_reaper(hub, **settings) -> None:
    response = service(hub, "PUT", "api/reaper", "admin", json=settings)
    assert response.status_code == 200, response.text


def test_warned_first_then_culled_and_told_why(demo, people):
    hub = demo
    alice = people("alice")
    alice.goto(f"{hub.url}/hub/spawn")
    expect(alice.locator("label[for=gpusched-profile-gpu-1]")).to_contain_text("1 h idle")
    ts.start_server(hub, "alice", "gpu-1")
    alice.goto(f"{hub.url}/user/alice/lab")
    expect(alice.locator(".jp-gpusched-status")).to_contain_text("1x H100", timeout=TIMEOUT_MS)

    # the reaper applies the profile's timeout, the one the form promised
    deadline = time.monotonic() + 30
    while (session := _session(hub, "alice")).get("timeout") is None:
        assert time.monotonic() < deadline, session
        time.sleep(0.5)
    assert session["timeout"] == 3600, session

    # alice has been idle since her server started (no kernel, GPU at 0%): admin lowers the
    # profile's timeout below that
    lowered = time.time()
    _set_reaper(hub, profile_timeouts={"gpu-1": 2}, warning_lead=WARNING_LEAD)

    # the warning comes first: a toast that is not cut off, the whole text one click away
    toast = alice.locator(".Toastify__toast").filter(has_text="Idle server:")
    expect(toast.first).to_be_visible(timeout=TIMEOUT_MS)
    summary = toast.first.inner_text()
    assert "will be stopped at" in summary and not summary.rstrip().endswith("\u2026"), summary
    assert re.search(r"stopped at \d\d:\d\d:\d\d", summary), summary  # to the second
    toast.first.get_by_role("button", name="Details").click()
    details = alice.locator(".jp-gpusched-notice-dialog")
    expect(details).to_contain_text(re.compile(r"stopped in \d+ s \(at \d\d:\d\d:\d\d"))
    assert "0 min" not in details.inner_text(), details.inner_text()
    shot(alice, TEST, "1-warning-details")
    alice.get_by_role("button", name="OK").click()
    [warned] = _events(hub, "alice", "reaper-warning")[:1]
    assert not _events(hub, "alice", "reaper-cull"), "culled without waiting out the warning"

    # the cull, warning_lead later: the Lab says why before it says the server is gone
    cull = alice.locator(".jp-gpusched-cull-dialog")
    expect(cull).to_be_visible(timeout=(WARNING_LEAD + 30) * 1000)
    expect(alice.locator(".jp-Dialog-header")).to_contain_text(
        ["The idle reaper is stopping this server"]
    )
    expect(cull).to_contain_text("idle")
    assert alice.get_by_text("Server unavailable").count() == 0
    shot(alice, TEST, "2-cull-explained-in-lab")
    alice.get_by_role("button", name="OK").click()
    ts.wait_gone(hub, "alice")
    [cull] = _events(hub, "alice", "reaper-cull")[:1]
    assert cull["time"] - warned["time"] >= WARNING_LEAD - 1, (warned, cull)
    assert cull["time"] >= lowered

    # the next page alice sees: the hub's home, saying what happened and why
    alice.goto(f"{hub.url}/hub/home")
    expect(alice.locator("body")).to_contain_text(re.compile("idle", re.I))
    expect(alice.locator("body")).to_contain_text(re.compile("reaper|stopped", re.I))
    shot(alice, TEST, "3-home-says-why")

    # the spawn form promises the timeout in force: admin's now, the profile's once cleared
    alice.goto(f"{hub.url}/hub/spawn")
    gpu_1 = alice.locator("label[for=gpusched-profile-gpu-1]")
    expect(gpu_1).to_contain_text("stops after 2 s idle")
    shot(alice, TEST, "4-form-promises-the-admins-timeout")
    _set_reaper(hub, profile_timeouts={}, warning_lead=300)  # the demo's again
    alice.reload()
    expect(gpu_1).to_contain_text("stops after 1 h idle")
    stop_everything(hub)


def test_a_cpu_only_server_is_reaped_on_activity(demo, people):
    """bob picks the demo's CPU-only profile in the spawn form: his Lab says so, the reaper
    judges the server by the hub's activity (no GPUs to sample); once bob has left it, admin
    lowers that profile's timeout and the server is warned, then stopped for no activity, and
    the hub's home page says so."""
    hub = demo
    bob = people("bob")
    bob.goto(f"{hub.url}/hub/spawn")
    expect(bob.locator("label[for=gpusched-profile-cpu-only]")).to_contain_text("CPU only")
    bob.check("#gpusched-profile-cpu-only")
    shot(bob, TEST, "4-cpu-only-profile")
    bob.get_by_role("button", name=re.compile("Start")).click()
    bob.wait_for_url(re.compile(".*/user/bob/lab.*"), timeout=TIMEOUT_MS * 3)
    expect(bob.locator(".jp-gpusched-status")).to_contain_text("CPU only", timeout=TIMEOUT_MS)
    shot(bob, TEST, "5-cpu-only-lab")
    [job] = jobs_of(hub, "bob", "running")
    assert job["gpus"] == 0 and job["kind"] == "notebook", job

    deadline = time.monotonic() + 30
    while (session := _session(hub, "bob")).get("measured_by") != "hub (last_activity)":
        assert time.monotonic() < deadline, session
        time.sleep(0.5)
    assert session["profile"] == "cpu-only" and session["timeout"] == 1800, session

    # bob leaves his Lab (its polls are activity); admin lowers the CPU-only profile's timeout
    bob.goto(f"{hub.url}/hub/home")
    _set_reaper(hub, profile_timeouts={"cpu-only": 6}, warning_lead=4)
    ts.wait_gone(hub, "bob")
    [warned] = _events(hub, "bob", "reaper-warning")[:1]
    [cull] = _events(hub, "bob", "reaper-cull")[:1]
    assert warned["message"].startswith("This server has had no activity since"), warned
    assert cull["time"] - warned["time"] >= 4 - 1, (warned, cull)
    assert "no activity" in cull["message"], cull

    bob.goto(f"{hub.url}/hub/home")
    expect(bob.locator("body")).to_contain_text(re.compile("no activity", re.I))
    shot(bob, TEST, "6-cpu-only-home-says-why")

    _set_reaper(hub, profile_timeouts={}, warning_lead=300)  # the demo's again
    stop_everything(hub)
