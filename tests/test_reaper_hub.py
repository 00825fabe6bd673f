"""The idle reaper under a real hub: JupyterHub, configurable-http-proxy, the scheduler service,
GPUSchedSpawner and real single-user servers with real kernels, on the simulated GPU backend
(``GPUSCHED_GPU_BACKEND=simulated``, the test cluster file, the hub's own load folder beside its
state directory), with the servers' GPU monitor sampling every second and reaper timeouts of a
few seconds. The servers and their kernels run as their users' own accounts (the hub is root).

* a kernel that keeps its GPU busy (``simulate_load`` run in the kernel over its websocket, then
  the websocket closed: no browser) is never culled, past the timeout;
* an idle server is warned (the notice reaches the server), then stopped; its GPUs go back and a
  queued user's server starts;
* an admin lowers the timeout at run time (``PUT api/reaper``) below a server's idle time: the
  server is warned at once and stopped ``warning_lead`` later, never in the same second; an
  exempt user is never culled; a non-admin cannot change the settings;
* a profile's own ``idle_timeout`` is the reaper's timeout for its servers (the spawn form,
  ``api/reaper`` and the server's status say the same), unless the admin's ``profile_timeouts``
  names the profile;
* after a cull of a named server, the hub's home page and its "Server not running" page say, in
  Chromium, that the idle reaper stopped it, when and why;
* a server that outlived a hub restart keeps reporting (its token for the service survives the
  restart) and is warned, then culled, like any other; its token goes with it.

The hub is started like ``tests/test_spawner.py``'s (its ``HubRunner`` and helpers), with this
module's profiles, policy file and environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import re
import threading
import time
from pathlib import Path

import hub_harness
import psutil
import pytest
import requests
import test_spawner as ts
from kernel_ws import run_cell

from jupyter_gpusched.core.durations import describe_duration

MONITOR_INTERVAL = 1.0  # the servers' GPUMonitor.interval
SAMPLE_INTERVAL = 1.0  # the service's own GPU samples (GPUSchedService.gpu_sample_interval)
SERVICE_POLL = 1.0  # the service's poll_interval (its default): the reaper ticks at each poll
# the reaper's events carry its decisions' times; "a whole lead later" is a float sum of them
FLOAT_SLACK = 1e-3
ACTIVITY_INTERVAL = 1  # the hub's reads of the proxy's activity, the servers' activity reports
# and the service's reads of the hub's last_activity (GPUSchedService.hub_activity_interval)
POLICY = """\
backfill: {interval: 1s}
reaper:
  timeout_tier_2: null  # each test sets its own at run time
  warning_lead: 2s
  stale_after: 10s
"""
EXTRA_CONFIG = (
    """
# -- added by tests/test_reaper_hub.py
c.GPUSchedSpawner.profiles = [
    {"display_name": "1 GPU (tier 2)", "slug": "t2-1", "gpus": 1},
    {"display_name": "2 GPUs (tier 2)", "slug": "t2-2", "gpus": 2},
    {"display_name": "1 GPU, 2 h idle", "slug": "t2-idle", "gpus": 1, "idle_timeout": "2h"},
    {"display_name": "CPU only (tier 2)", "slug": "t2-cpu", "gpus": 0, "cpus": 1, "tier": 2},
]
from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service

pass_idle_timeouts_to_service(c)  # the service learns the profiles' idle timeouts
c.GPUSchedSpawner.queue_poll_interval = 0.3
c.Spawner.http_timeout = 60
c.Spawner.args = ["--GPUMonitor.interval=MONITOR_INTERVAL"]
# CPU-only servers are judged by the hub's last_activity: the hub reads the proxy's every
# ACTIVITY_INTERVAL, and the servers report theirs (kernels, API requests) as often
c.JupyterHub.last_activity_interval = ACTIVITY_INTERVAL
c.Spawner.environment = {
    **c.Spawner.environment,
    "JUPYTERHUB_ACTIVITY_INTERVAL": "ACTIVITY_INTERVAL",
}
""".replace("MONITOR_INTERVAL", f"{MONITOR_INTERVAL:g}").replace(
        "ACTIVITY_INTERVAL", f"{ACTIVITY_INTERVAL}"
    )
    + hub_harness.SERVICE_ARGS_CONFIG.format(
        service=hub_harness.SERVICE,
        service_args=[
            f"--GPUSchedService.gpu_sample_interval={SAMPLE_INTERVAL:g}",
            f"--GPUSchedService.hub_activity_interval={ACTIVITY_INTERVAL}",
        ],
    )
)


def simulated_gpus(runner: ts.HubRunner, extra_config: str) -> None:
    """``runner``'s hub on the simulated GPUs of its cluster file, with ``extra_config`` in
    place of test_spawner's."""
    runner.env.pop("GPUSCHED_SIM_GPU_DIR", None)  # the config's own: STATE-sim-gpus
    runner.env.update(
        GPUSCHED_GPU_BACKEND="simulated",
        GPUSCHED_SIM_CLUSTER=runner.env["GPUSCHED_CLUSTER_FILE"],
    )
    config = runner.config.read_text()
    assert ts.EXTRA_CONFIG in config
    runner.config.write_text(config.replace(ts.EXTRA_CONFIG, extra_config))


class ReaperHub(ts.HubRunner):
    def __init__(self):
        super().__init__()
        hub_harness.readable_file(self.state_dir, "test-policy.yaml", POLICY)  # the env's file
        simulated_gpus(self, EXTRA_CONFIG)


@pytest.fixture(scope="module")
def reaper_runner():
    with ts.module_hub(ReaperHub) as running:
        yield running


@pytest.fixture
def hub(reaper_runner):
    yield reaper_runner.hub
    hub = reaper_runner.hub  # the hub now: a test may have restarted it
    ts.stop_every_server(hub)
    admin = hub.token("admin")
    jobs = hub.service("GET", "api/jobs?state=running&state=pending", admin).json()
    for job in jobs["jobs"]:
        hub.service("DELETE", f"api/jobs/{job['id']}", admin)
    ts.wait_free(hub, 4, timeout=15)


# -- helpers -------------------------------------------------------------------------------------
def set_reaper(hub, token, **changes) -> requests.Response:
    return hub.service("PUT", "api/reaper", token, json=changes)


def configure(hub, **changes) -> dict:
    response = set_reaper(hub, hub.token("admin"), **changes)
    assert response.status_code == 200, response.text
    return response.json()["settings"]


def sessions(hub) -> dict:
    """The reaper's sessions by user (admin view)."""
    response = hub.service("GET", "api/reaper", hub.token("admin"))
    assert response.status_code == 200, response.text
    return {s["user"]: s for s in response.json()["sessions"]}


def server_get(hub, user, path):
    url = hub.url + f"/user/{user}/" + path
    response = requests.get(url, headers={"Authorization": f"token {hub.token(user)}"}, timeout=10)
    assert response.status_code == 200, f"{url}: {response.status_code} {response.text[:300]}"
    return response.json()


def notices(hub, user) -> list[dict] | None:
    """The notices of ``user``'s server; None when it no longer answers."""
    url = hub.url + f"/user/{user}/gpusched/api/notices"
    headers = {"Authorization": f"token {hub.token(user)}"}
    with contextlib.suppress(requests.RequestException, ValueError):
        response = requests.get(url, headers=headers, timeout=5, allow_redirects=False)
        if response.status_code == 200:
            return response.json()["notices"]
    return None


def _wait_sessions(hub, users, field: str, what: str, timeout: float, after: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = sessions(hub)
        if all(((found.get(u) or {}).get(field) or 0) > after for u in users):
            return found
        assert time.monotonic() < deadline, f"no {what} of {users}' servers: {found}"
        time.sleep(0.2)


def wait_reported(hub, *users, timeout=15.0, after=0.0) -> dict:
    """Until the reaper has a monitor report from each of ``users``' servers (one received
    after the epoch time ``after``)."""
    return _wait_sessions(hub, users, "last_report", "monitor report", timeout, after)


def wait_measured(hub, *users, timeout=15.0, after=0.0) -> dict:
    """Until the service has measured each of ``users``' servers itself (a measurement taken
    after the epoch time ``after``): the reaper's idle time counts from the first one."""
    return _wait_sessions(hub, users, "last_measured", "measurement", timeout, after)


def job_id_of(hub, user) -> str:
    return ts.server_env(hub, user)["GPUSCHED_JOB_ID"]


def cull_events(hub, job_id) -> list[dict]:
    response = hub.service(
        "GET", f"api/events?kind=reaper-cull&job_id={job_id}", hub.token("admin")
    )
    assert response.status_code == 200, response.text
    return response.json()["events"]


def reaper_events(hub, job_id, kind) -> list[dict]:
    response = hub.service("GET", f"api/events?kind={kind}&job_id={job_id}", hub.token("admin"))
    assert response.status_code == 200, response.text
    return response.json()["events"]


def service_tokens(hub, user) -> list[dict]:
    """``user``'s tokens in the hub that GPUSchedSpawner made (their notes name it)."""
    response = requests.get(
        hub.api_url + f"users/{user}/tokens",
        headers={"Authorization": f"token {hub.harness_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return [
        t for t in response.json()["api_tokens"] if (t["note"] or "").startswith("gpusched spawner")
    ]


def kernel_processes(kernel_id: str) -> list[int]:
    """PIDs of running processes of this kernel (its command line names its connection file)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if process.info["status"] != psutil.STATUS_ZOMBIE and any(
                kernel_id in part for part in process.info["cmdline"] or []
            ):
                found.append(process.pid)
    return found


def start_kernel(hub, user) -> str:
    url = hub.url + f"/user/{user}/api/kernels"
    headers = {"Authorization": f"token {hub.token(user)}"}
    response = requests.post(url, json={"name": "python3"}, headers=headers, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def execute(hub, user, kernel_id, code, timeout=30.0) -> dict:
    ws_url = hub.url.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel_id}/channels"
    return asyncio.run(run_cell(ws_url, hub.token(user), code, timeout))[0]


# -- the scenarios -------------------------------------------------------------------------------
def test_a_busy_kernel_is_never_culled_past_the_timeout(hub):
    configure(hub, timeout_tier_2=60, warning_lead=2, exempt_users=[])  # long: while it starts
    ts.start_server(hub, "alice", "t2-1")
    env = ts.server_env(hub, "alice")
    assert env["GPUSCHED_GPU_BACKEND"] == "simulated"
    assert env["GPUSCHED_SIM_GPU_DIR"] == f"{hub.state_dir}-sim-gpus"  # this hub's own
    kernel = start_kernel(hub, "alice")
    if os.geteuid() == 0:  # a root hub: the kernel is alice's, not root's
        alice = pwd.getpwnam("alice")
        code = f"import os\nassert (os.getuid(), os.getgid()) == {(alice.pw_uid, alice.pw_gid)}"
        reply = execute(hub, "alice", kernel, code)
        assert reply["status"] == "ok", reply
        assert env["HOME"] == alice.pw_dir and env["USER"] == "alice"
    reply = execute(
        hub,
        "alice",
        kernel,
        "from jupyter_gpusched.backends.gpu import simulate_load\n"
        "simulate_load(util=90, seconds=600)",
    )
    assert reply["status"] == "ok", reply
    # the websocket is closed: no browser, no client; only the GPU is busy
    deadline = time.monotonic() + 10
    while True:
        monitor = server_get(hub, "alice", "gpusched/api/kernels")
        if (monitor["kernels"].get(kernel) or {}).get("utilization", 0) >= 90:
            break
        assert time.monotonic() < deadline, f"the load is not attributed to {kernel}: {monitor}"
        time.sleep(0.3)
    assert monitor["interval"] == MONITOR_INTERVAL
    assert monitor["server"]["utilization"] >= 90
    assert [d["utilization"] for d in monitor["devices"]] == [90.0]  # its one GPU
    # and the service measures it busy itself (its sample, a second or two later)
    deadline = time.monotonic() + 10
    while ((sessions(hub)["alice"]["last_sample"] or {}).get("utilization") or 0) < 90:
        assert time.monotonic() < deadline, f"not measured busy: {sessions(hub)['alice']}"
        time.sleep(0.3)

    timeout = 3.0
    configure(hub, timeout_tier_2=timeout)
    job_id = env["GPUSCHED_JOB_ID"]
    end = time.monotonic() + 3 * timeout + 2 * MONITOR_INTERVAL
    while time.monotonic() < end:
        server = ts.servers_of(hub, "alice").get("")
        assert server and server["ready"] and not server.get("stopped"), f"culled: {server}"
        session = sessions(hub)["alice"]
        assert session["timeout"] == timeout
        assert time.time() - session["idle_since"] < timeout, session  # busy: never idle long
        assert session["warned"] is None, session
        time.sleep(0.5)
    assert not cull_events(hub, job_id)
    assert not [n for n in notices(hub, "alice") or [] if n["kind"] == "idle"]
    assert ts.service_job(hub, "alice", job_id)["state"] == "running"


@contextlib.contextmanager
def monitor_switched_off(user):
    """``c.GPUMonitor.report = False`` in ``user``'s own ~/.jupyter/jupyter_server_config.py,
    as any user may write it (restored afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("writing a demo user's own server config needs root")
    account = pwd.getpwnam(user)
    folder = Path(account.pw_dir) / ".jupyter"
    path = folder / "jupyter_server_config.py"
    made_folder, before = not folder.exists(), path.read_bytes() if path.exists() else None
    folder.mkdir(exist_ok=True)
    os.chown(folder, account.pw_uid, account.pw_gid)
    opt_out = b"\nc.GPUMonitor.report = False  # tests/test_reaper_hub.py: no reports\n"
    path.write_bytes((before or b"") + opt_out)
    os.chown(path, account.pw_uid, account.pw_gid)
    try:
        yield
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_bytes(before)
        if made_folder:
            with contextlib.suppress(OSError):
                folder.rmdir()


def wait_all_culled(
    hub, users: dict[str, str], timeout: float, claim=None, read_notices=True
) -> dict[str, list]:
    """Until each of ``users`` (user -> job id) has no server; the notices each server showed
    meanwhile (``read_notices``: reading them is a request through the proxy to the server,
    activity by which a CPU-only server is judged). ``claim(user)``: called at each round
    while the server runs."""
    seen: dict[str, list] = {user: [] for user in users}
    deadline = time.monotonic() + timeout
    while running := [u for u in users if "" in ts.servers_of(hub, u)]:
        for user in running:
            if read_notices:
                seen[user] = notices(hub, user) or seen[user]
            if claim is not None:
                claim(user)
        assert time.monotonic() < deadline, f"{running} still running: {sessions(hub)}"
        time.sleep(0.25)
    for user, job_id in users.items():
        ts.wait_job(hub, user, job_id, ts.RELEASED, timeout=ts.RELEASE_TIMEOUT)
    return seen


def test_a_user_who_switches_the_monitor_off_is_warned_and_culled_like_a_control(hub):
    """Issue 16, point 2: the opt-out in the user's own config silences the monitor, not the
    reaper: carol's server sends no report at all, and is warned and culled on the service's
    own samples, on the same timeout as bob's control server."""
    configure(hub, timeout_tier_2=None, warning_lead=2, exempt_users=[])
    with monitor_switched_off("carol"):
        ts.start_server(hub, "carol", "t2-1")
        ts.start_server(hub, "bob", "t2-1")  # the control
    jobs = {user: job_id_of(hub, user) for user in ("bob", "carol")}
    found = wait_measured(hub, "bob", "carol")
    wait_reported(hub, "bob")
    time.sleep(2 * MONITOR_INTERVAL)  # carol's monitor would have reported by now
    assert sessions(hub)["carol"]["last_report"] is None  # switched off indeed
    idle = time.time() - min(found[user]["idle_since"] for user in jobs)
    timeout = round(idle + 4, 1)
    configure(hub, timeout_tier_2=timeout)
    seen = wait_all_culled(hub, jobs, timeout=4 + 2 + 15)
    for user, job_id in jobs.items():
        warnings = [n for n in seen[user] if n["kind"] == "idle"]
        assert len(warnings) == 1, f"{user}: not one idle warning before the cull: {seen[user]}"
        (cull,) = cull_events(hub, job_id)
        assert cull["data"]["reason"] == "idle" and cull["data"]["idle_seconds"] >= timeout


def test_an_idle_server_whose_token_claims_busy_is_still_culled(hub):
    """Issue 16, point 2: reports are not measurements. An idle server's own token posts
    reports claiming its GPU 100% busy, four a second, as a user could: it is warned and culled
    on the service's samples all the same (the reports are accepted: trusted backend)."""
    configure(hub, timeout_tier_2=None, warning_lead=2, exempt_users=[])
    ts.start_server(hub, "bob", "t2-1")
    env = ts.server_env(hub, "bob")
    token, job_id = env["GPUSCHED_SERVICE_TOKEN"], env["GPUSCHED_JOB_ID"]
    busy, (gpu,) = {"utilization": 100.0, "memory_gb": 20.0}, ts.visible(env)
    forged = {
        "job_id": job_id,
        "backend": "simulated",  # what this hub's monitors say
        "server": {**busy, "gpus": [gpu]},
        "devices": [{"index": gpu, **busy}],
        "kernels": {"k": busy},
    }

    def claim(user):
        response = hub.service("POST", "api/usage-samples", token, json=forged)
        assert response.status_code in (200, 404), response.text  # 404: culled meanwhile

    answer = hub.service("POST", "api/usage-samples", token, json=forged)
    assert answer.status_code == 200 and answer.json()["ignored"] is None, answer.text
    idle = time.time() - wait_measured(hub, "bob")["bob"]["idle_since"]
    timeout = round(idle + 4, 1)
    configure(hub, timeout_tier_2=timeout)
    seen = wait_all_culled(hub, {"bob": job_id}, timeout=4 + 2 + 15, claim=claim)
    assert len([n for n in seen["bob"] if n["kind"] == "idle"]) == 1, seen
    (cull,) = cull_events(hub, job_id)
    assert cull["data"]["reason"] == "idle" and cull["data"]["idle_seconds"] >= timeout
    assert cull["data"]["samples"][-1]["devices"][0]["utilization"] == 0.0  # what it measured


def test_an_idle_server_is_warned_then_stopped_and_a_queued_user_starts(hub):
    configure(hub, timeout_tier_2=None, warning_lead=4, exempt_users=[])  # none while it starts
    filler = ts.hold_gpus(hub, "admin", 2)  # a batch job: never reaped
    ts.start_server(hub, "bob", "t2-2")
    bob_job = job_id_of(hub, "bob")
    bob_gpus = ts.visible(ts.server_env(hub, "bob"))
    assert ts.free_gpus(hub) == 0
    carol_start = ts.start_in_background(hub, "carol", "t2-2")
    ts.wait_pending(hub, "carol")
    # idleness counts from the service's first measurement of the server (a varying few seconds
    # ago here): warn 2 s from now, stop 6 s from now
    idle = time.time() - wait_measured(hub, "bob")["bob"]["idle_since"]
    timeout = round(idle + 6, 1)
    configure(hub, timeout_tier_2=timeout)

    seen = []
    deadline = time.monotonic() + 6 + 10
    while "" in ts.servers_of(hub, "bob"):
        found = notices(hub, "bob")
        if found:
            seen = found
        assert time.monotonic() < deadline, f"bob's idle server is still running: {sessions(hub)}"
        time.sleep(0.25)
    idle = [n for n in seen if n["kind"] == "idle"]
    assert len(idle) == 1, f"not one idle warning at bob's server before it stopped: {seen}"
    assert idle[0]["job_id"] == bob_job and idle[0]["deadline"] > 0
    assert "will be stopped" in idle[0]["message"]

    job = ts.wait_job(hub, "bob", bob_job, ts.RELEASED, timeout=ts.RELEASE_TIMEOUT)
    (cull,) = cull_events(hub, bob_job)
    assert cull["data"]["reason"] == "idle" and cull["data"]["timeout"] == timeout
    assert cull["data"]["idle_seconds"] >= timeout and cull["data"]["samples"]
    assert job["state"] in ts.RELEASED
    assert job["message"].startswith("culled by the reaper: GPUs idle"), job  # not "stopped by"

    ts.wait_ready(hub, "carol")  # the queued user's server got bob's GPUs
    carol_start.join(10)
    carol_env = ts.server_env(hub, "carol")
    assert ts.visible(carol_env) == bob_gpus
    assert ts.service_job(hub, "carol", carol_env["GPUSCHED_JOB_ID"])["state"] == "running"
    assert ts.service_job(hub, "admin", filler)["state"] == "running"


def test_admin_lowers_the_timeout_at_run_time_exempt_users_stay(hub):
    alice = hub.token("alice")
    refused = set_reaper(hub, alice, timeout_tier_2=1)
    assert refused.status_code == 403, refused.text
    read = hub.service("GET", "api/reaper", alice)  # reading is fine
    assert read.status_code == 200, read.text
    assert read.json()["defaults"]["stale_after"] == 10  # the policy file's reaper: section

    lead = 3.0
    configure(hub, timeout_tier_2=None, warning_lead=lead, exempt_users=["carol"])
    ts.start_server(hub, "bob", "t2-1")
    ts.start_server(hub, "carol", "t2-1")
    bob_job = job_id_of(hub, "bob")
    wait_measured(hub, "bob", "carol")
    time.sleep(2 * SAMPLE_INTERVAL)  # idle, but no timeout: nobody is culled
    assert set(ts.servers_of(hub, "bob")) == {""} and set(ts.servers_of(hub, "carol")) == {""}
    assert not cull_events(hub, bob_job)

    timeout = 2.0
    changed = time.time()
    settings = configure(hub, timeout_tier_2=timeout)
    assert settings["timeout_tier_2"] == timeout and settings["exempt_users"] == ["carol"]
    deadline = time.monotonic() + 10 + lead
    seen = []
    while not (events := cull_events(hub, bob_job)):
        seen = notices(hub, "bob") or seen
        assert time.monotonic() < deadline, f"bob was not culled: {sessions(hub)}"
        time.sleep(0.1)
    # bob had been idle longer than the new timeout: the next tick warns him (1 s of slack for
    # a loaded machine), and he is stopped warning_lead later, not at once
    (warning,) = reaper_events(hub, bob_job, "reaper-warning")
    assert warning["time"] - changed <= SERVICE_POLL + 1.0, warning
    assert events[0]["time"] - warning["time"] >= lead - FLOAT_SLACK, (warning, events[0])
    assert f"stopped in {lead:g} s (at " in warning["message"], warning["message"]
    assert [n["message"] for n in seen if n["kind"] == "idle"] == [warning["message"]]
    assert events[0]["data"]["settings"]["timeout_tier_2"] == timeout
    ts.wait_gone(hub, "bob", timeout=10)

    end = time.monotonic() + 2 * timeout + 2 * MONITOR_INTERVAL
    while time.monotonic() < end:
        server = ts.servers_of(hub, "carol").get("")
        assert server and server["ready"], f"exempt carol was culled: {server}"
        time.sleep(0.5)
    carol = sessions(hub)["carol"]
    assert carol["exempt"] and time.time() - carol["idle_since"] > timeout
    assert not cull_events(hub, carol["job_id"])
    assert not [n for n in notices(hub, "carol") or [] if n["kind"] == "idle"]


def test_kernels_holding_gpu_memory_go_first_then_the_idle_server(hub):
    configure(hub, timeout_tier_2=None, warning_lead=4, exempt_users=[])
    configure(hub, shutdown_kernels_first=True)
    try:
        ts.start_server(hub, "bob", "t2-1")
        bob_job = job_id_of(hub, "bob")
        holding, plain = start_kernel(hub, "bob"), start_kernel(hub, "bob")
        code = "from jupyter_gpusched.backends.gpu import simulate_load\n"
        code += "simulate_load(util=0, memory_gb=6, seconds=None)"  # idle, but holds memory
        assert execute(hub, "bob", holding, code)["status"] == "ok"
        deadline = time.monotonic() + 10
        while (server_get(hub, "bob", "gpusched/api/kernels")["kernels"].get(holding) or {}).get(
            "memory_gb", 0
        ) < 6:
            assert time.monotonic() < deadline, "the kernel's GPU memory is not attributed"
            time.sleep(0.3)
        wait_reported(hub, "bob")
        wait_measured(hub, "bob")
        time.sleep(MONITOR_INTERVAL + SERVICE_POLL)  # a report with the memory reached the reaper
        idle = time.time() - sessions(hub)["bob"]["idle_since"]
        configure(hub, timeout_tier_2=round(idle + 1, 1))

        deadline = time.monotonic() + 15
        while holding in {k["id"] for k in server_get(hub, "bob", "api/kernels")}:
            assert time.monotonic() < deadline, f"{holding} still runs: {sessions(hub)}"
            time.sleep(0.25)
        assert plain in {k["id"] for k in server_get(hub, "bob", "api/kernels")}
        assert "" in ts.servers_of(hub, "bob")  # the server stays, for warning_lead
        admin = hub.token("admin")
        events = hub.service("GET", f"api/events?kind=reaper-kernels&job_id={bob_job}", admin)
        (shut,) = events.json()["events"]
        assert shut["data"]["kernel_ids"] == [holding]
        found = notices(hub, "bob") or []
        assert [n["kernel_ids"] for n in found if n["kind"] == "shutdown-kernels"] == [[holding]]

        # still GPU-idle warning_lead (4 s) later: the server is stopped
        ts.wait_job(hub, "bob", bob_job, ts.RELEASED, timeout=4 + 2 + ts.RELEASE_TIMEOUT)
        assert not kernel_processes(plain), "a kernel outlived its server's GPU release"
        (cull,) = cull_events(hub, bob_job)
        assert cull["time"] - shut["time"] >= 4
    finally:
        configure(hub, shutdown_kernels_first=False)


def test_a_server_that_outlived_a_hub_restart_keeps_reporting_and_is_culled(reaper_runner, hub):
    """hub_config keeps servers across hub restarts (cleanup_servers = False): the server's token
    for the service must survive too, or its reports get 401 and the reaper never culls it."""
    configure(hub, timeout_tier_2=None, warning_lead=3, exempt_users=[])  # stored: survives
    ts.start_server(hub, "bob", "t2-1")
    bob_job = job_id_of(hub, "bob")
    pid = ts.spawner_state(hub, "bob")["pid"]
    token = ts.server_env(hub, "bob")["GPUSCHED_SERVICE_TOKEN"]
    wait_reported(hub, "bob")

    reaper_runner.stop_keeping_servers()
    assert psutil.pid_exists(pid)
    hub = reaper_runner.start()  # its spawner has polled bob's server (and asked the service)
    server = ts.wait_ready(hub, "bob")
    assert server["state"]["pid"] == pid and server["state"]["gpusched"]["job_id"] == bob_job
    up = time.time()
    me = hub.service("GET", "api/me", token)  # the token the running server holds still works
    assert me.status_code == 200 and me.json()["name"] == "bob", me.text
    # the new service hears from the server again, well after the hub's first poll of it
    found = wait_reported(hub, "bob", after=up + 2 * MONITOR_INTERVAL, timeout=20)
    assert found["bob"]["job_id"] == bob_job
    found = wait_measured(hub, "bob", after=up)  # and the new service measures it

    idle = time.time() - found["bob"]["idle_since"]
    timeout = round(idle + 5, 1)  # warned 2 s from now, culled 5 s from now
    configure(hub, timeout_tier_2=timeout)
    seen = []
    deadline = time.monotonic() + 5 + 15
    while "" in ts.servers_of(hub, "bob"):
        seen = notices(hub, "bob") or seen
        assert time.monotonic() < deadline, f"bob's idle server is still running: {sessions(hub)}"
        time.sleep(0.25)
    warnings = [n for n in seen if n["kind"] == "idle" and n["job_id"] == bob_job]
    assert len(warnings) == 1, f"not one idle warning before the cull: {seen}"
    ts.wait_job(hub, "bob", bob_job, ts.RELEASED, timeout=ts.RELEASE_TIMEOUT)
    (cull,) = cull_events(hub, bob_job)
    assert cull["data"]["reason"] == "idle" and cull["data"]["idle_seconds"] >= timeout
    # the server is gone, and so is its token (the hub refuses it at once; the service within
    # its auth_cache_max_age); the spawner's own stays for its next requests
    gone = requests.get(
        hub.api_url + "user", headers={"Authorization": f"token {token}"}, timeout=10
    )
    assert gone.status_code in (401, 403), gone.text
    notes = [t["note"] for t in service_tokens(hub, "bob")]
    assert notes == ["gpusched spawner (hub): bob/"], notes


def test_the_profiles_idle_timeout_is_the_one_the_reaper_applies(hub):
    configure(hub, timeout_tier_2=60, warning_lead=2, exempt_users=[], profile_timeouts={})
    form = logged_in(hub, "alice")
    try:  # the form promises the timeout in force: an admin's change for the profile, ...
        configure(hub, profile_timeouts={"t2-idle": "20m"})
        page = form.get(hub.url + "/hub/spawn/alice", timeout=10)
        assert "stops after 20 min idle" in page.text, page.text[-3000:]
        configure(hub, exempt_users=["alice"])  # ... an exemption
        assert "not stopped when idle" in form.get(hub.url + "/hub/spawn/alice", timeout=10).text
    finally:
        configure(hub, profile_timeouts={}, exempt_users=[])
    page = form.get(hub.url + "/hub/spawn/alice", timeout=10)
    assert page.status_code == 200 and 'value="t2-idle"' in page.text, page.text[-3000:]
    assert "stops after 2 h idle" in page.text  # the form's promise: the profile's own, ...
    assert "stops after 1 min idle" in page.text  # ... and where it has none, its tier's
    ts.start_server(hub, "alice", "t2-idle")
    found = wait_reported(hub, "alice")
    assert found["alice"]["profile"] == "t2-idle"
    assert found["alice"]["timeout"] == 7200  # the profile's, not the tier's 60 s
    settings = hub.service("GET", "api/reaper", hub.token("alice")).json()["settings"]
    assert settings["profile_idle_timeouts"] == {"t2-idle": 7200}  # t2-1, t2-2 have none
    assert server_get(hub, "alice", "gpusched/api/status")["reaper"]["timeout"] == 7200
    # the server's own token reports another profile (its GPUSCHED_PROFILE is the user's):
    # the reaper keeps the one the spawner named
    token = ts.server_env(hub, "alice")["GPUSCHED_SERVICE_TOKEN"]
    claim = {"job_id": found["alice"]["job_id"], "profile": "t2-1", "backend": "simulated"}
    answer = hub.service("POST", "api/usage-samples", token, json=claim)
    assert answer.status_code == 200 and answer.json()["timeout"] == 7200, answer.text
    assert sessions(hub)["alice"]["profile"] == "t2-idle"
    refused = set_reaper(hub, hub.token("admin"), profile_idle_timeouts={"t2-idle": 1})
    assert refused.status_code == 400 and refused.json()["field"] == "profile_idle_timeouts"
    try:  # the admin's setting for the profile wins over the profile's own
        configure(hub, profile_timeouts={"t2-idle": "20m"})
        assert sessions(hub)["alice"]["timeout"] == 1200
        assert server_get(hub, "alice", "gpusched/api/status")["reaper"]["timeout"] == 1200
    finally:
        configure(hub, profile_timeouts={})


def test_after_a_cull_the_hub_pages_say_why(hub):
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        pytest.skip("/usr/bin/chromium is missing: run scripts/install-system.sh")
    configure(hub, timeout_tier_2=None, warning_lead=1, exempt_users=[])
    ts.start_server(hub, "bob", "t2-1", name="work")  # a named server
    job_id = job_id_of_named(hub, "bob", "work")
    wait_measured(hub, "bob")
    configure(hub, timeout_tier_2=1)  # already past it: warned now, stopped 1 s later
    ts.wait_job(hub, "bob", job_id, ts.RELEASED, timeout=10 + ts.RELEASE_TIMEOUT)
    ts.wait_gone(hub, "bob", "work", timeout=15)
    (cull,) = cull_events(hub, job_id)
    idle = re.escape(describe_duration(cull["data"]["idle_seconds"]))
    expected = re.compile(
        r"The idle reaper stopped your server 'work' at \d\d:\d\d:\d\d UTC \(\d{4}-\d\d-\d\d\): "
        rf"its GPUs \(\w+:\d+\) were idle for {idle}, and the idle timeout is 1 s\."
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{hub.url}/hub/login")
            page.fill("input[name=username]", "bob")
            page.fill("input[name=password]", hub.password)
            page.click("input[type=submit], button[type=submit]")
            page.wait_for_url("**/hub/**")
            page.goto(f"{hub.url}/hub/home")
            note = page.locator(".gpusched-stopped [data-server-name=work]")
            sync_api.expect(note).to_have_text(expected)
            # Lab, reloaded after its server went: the hub's "Server not running" page
            page.goto(f"{hub.url}/hub/user/bob/work/lab")
            sync_api.expect(page.locator("p.gpusched-stopped")).to_have_text(expected)
        finally:
            browser.close()
    # a new start of the server ends the story (with no 1 s timeout left, which would warn and
    # cull the new server while the hub still waits for it to answer: JupyterHub answers such
    # an interrupted start with a 500)
    configure(hub, timeout_tier_2=None)
    again = ts.start_server(hub, "bob", "t2-1", name="work", wait=False)
    assert again.status_code in (201, 202), f"{again.text}\n{hub.log_tail(80)}"
    ts.wait_ready(hub, "bob", "work")
    home = logged_in(hub, "bob").get(hub.url + "/hub/home", timeout=10)
    assert home.status_code == 200 and "Named Servers" in home.text, home.text[-3000:]
    assert 'data-server-name="work"' in home.text  # its row in the server table
    assert 'class="alert alert-warning" data-server-name="work"' not in home.text


# -- CPU-only servers: judged by the hub's last_activity, as jupyterhub-idle-culler does ---------
def test_an_idle_cpu_only_server_is_warned_then_culled_for_no_activity(hub):
    """Issue 16, point 6: a ``gpus: 0`` profile's server is a 0-GPU notebook job of the
    scheduler, and with nothing talking to it, it is warned and then culled on the hub's
    last_activity of it (``api/reaper`` says so). Nothing here goes through the proxy to the
    server (not even a read of its notices): that would be activity."""
    lead = 2.0
    configure(hub, timeout_tier_2=None, warning_lead=lead, exempt_users=[])
    ts.start_server(hub, "bob", "t2-cpu")
    env = ts.server_env(hub, "bob")
    job_id = env["GPUSCHED_JOB_ID"]
    assert env["GPUSCHED_GPUS"] == "0" and env["CUDA_VISIBLE_DEVICES"] == ""
    job = ts.service_job(hub, "bob", job_id)
    assert (job["state"], job["kind"], job["gpus"], job["cpus"]) == ("running", "notebook", 0, 1)
    found = wait_measured(hub, "bob")["bob"]
    assert found["gpus"] == 0 and found["measured_by"] == "hub (last_activity)", found
    sample = found["last_sample"]  # the hub's figure (from before the start, or since)
    assert sample["measured_by"] == "hub (last_activity)" and sample["activity"] > 0, found
    assert found["unmonitored_since"] is None and found["warned"] is None, found

    idle = time.time() - found["idle_since"]
    timeout = round(idle + 4, 1)  # warned 2 s from now, culled 4 s from now
    configure(hub, timeout_tier_2=timeout)
    wait_all_culled(hub, {"bob": job_id}, timeout=4 + lead + 15, read_notices=False)
    # one warning, even when the hub reports the server's start-up activity late (it moves the
    # stretch's start, the warning stands: core/reaper.py, Session.measured)
    warnings = reaper_events(hub, job_id, "reaper-warning")
    assert len(warnings) == 1, warnings
    (warning,) = warnings
    assert warning["message"].startswith("This server has had no activity since "), warning
    assert "unless it is used" in warning["message"], warning
    (cull,) = cull_events(hub, job_id)
    assert cull["time"] - warning["time"] >= lead - FLOAT_SLACK, (warning, cull)
    assert cull["data"]["reason"] == "idle" and cull["data"]["idle_seconds"] >= timeout
    job = ts.service_job(hub, "bob", job_id)
    assert job["state"] in ts.RELEASED and job["gpus"] == 0, job
    assert job["message"].startswith("culled by the reaper: no activity for "), job


def test_a_cpu_only_server_in_use_is_never_culled_while_an_idle_one_is(hub):
    """Issue 16, point 6: alice's CPU-only server gets a request through the proxy every second
    (as a client or an open tab makes), which the hub records as its activity: it is neither
    warned nor culled for twice the timeout, while bob's idle CPU-only server on the same
    settings (the control) is culled."""
    configure(hub, timeout_tier_2=None, warning_lead=2, exempt_users=[])
    ts.start_server(hub, "alice", "t2-cpu")
    ts.start_server(hub, "bob", "t2-cpu")
    jobs = {user: job_id_of(hub, user) for user in ("alice", "bob")}
    stop = threading.Event()

    def use():
        url = hub.url + "/user/alice/api/status"
        headers = {"Authorization": f"token {hub.token('alice')}"}
        while not stop.wait(1.0):  # the pace of the use, not a wait for a condition
            with contextlib.suppress(requests.RequestException):
                requests.get(url, headers=headers, timeout=5)

    user = threading.Thread(target=use, daemon=True)
    began = time.time()
    user.start()
    try:
        wait_measured(hub, "bob")
        deadline = time.monotonic() + 15
        while (alice := sessions(hub)["alice"])["idle_since"] <= began:
            assert time.monotonic() < deadline, f"alice's use is not seen: {alice}"
            time.sleep(0.2)
        assert alice["measured_by"] == "hub (last_activity)", alice
        timeout = 8.0  # longer than the way of activity to the reaper (about 4 s here)
        configure(hub, timeout_tier_2=timeout)
        changed = time.monotonic()
        wait_all_culled(hub, {"bob": jobs["bob"]}, timeout=timeout + 15, read_notices=False)
        (cull,) = cull_events(hub, jobs["bob"])
        assert cull["data"]["reason"] == "idle" and cull["data"]["idle_seconds"] >= timeout
        while time.monotonic() < changed + 2 * timeout:
            server = ts.servers_of(hub, "alice").get("")
            assert server and server["ready"] and not server.get("stopped"), f"culled: {server}"
            alice = sessions(hub)["alice"]
            assert time.time() - alice["idle_since"] < timeout and alice["warned"] is None, alice
            time.sleep(0.5)
    finally:
        stop.set()
        user.join(10)
    assert not reaper_events(hub, jobs["alice"], "reaper-warning")
    assert not cull_events(hub, jobs["alice"])
    assert ts.service_job(hub, "alice", jobs["alice"])["state"] == "running"


def logged_in(hub, user) -> requests.Session:
    """A session logged in to the hub's pages as ``user`` (pages take no API token)."""
    session = requests.Session()
    session.get(hub.url + "/hub/login", timeout=10)
    form = {"username": user, "password": hub.password, "_xsrf": session.cookies["_xsrf"]}
    response = session.post(hub.url + "/hub/login", data=form, timeout=10)
    assert response.status_code == 200 and "/hub/login" not in response.url, response.url
    return session


def job_id_of_named(hub, user, name) -> str:
    return ts.server_env(hub, user, name)["GPUSCHED_JOB_ID"]
