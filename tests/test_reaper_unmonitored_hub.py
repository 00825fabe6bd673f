"""Unmonitored servers under a real hub (issue 16, point 2): a server on a node that no source of
the service samples (here: ``dark1``, left out of ``local_gpu_nodes``) is listed as unmonitored
in ``api/reaper`` with the reason, audited once (``reaper-unmonitored``) and counted in the gauge
``gpusched_unmonitored_servers``; under ``unmonitored: warn`` its owner's server gets the notice
``kind: "unmonitored"`` and keeps running past the idle timeout; under ``unmonitored: cull`` it is
warned with the whole ``warning_lead`` and culled.

The hub is ``tests/test_reaper_hub.py``'s (``test_spawner.HubRunner``, simulated GPUs), with a
cluster of two nodes: ``gpu1`` (4 H100, sampled here) and ``dark1`` (1 L40S, not sampled).
"""

from __future__ import annotations

import time

import hub_harness
import pytest
import test_spawner as ts
from test_reaper_hub import (
    configure,
    cull_events,
    notices,
    reaper_events,
    sessions,
    simulated_gpus,
)

CLUSTER = ts.TEST_CLUSTER + "  - {name: dark1, gpus: 1, gpu_model: L40S}\n"  # unsampled
POLICY = """\
backfill: {interval: 1s}
reaper:
  timeout_tier_2: null
  warning_lead: 2s
  unmonitored_after: 2s
"""
EXTRA_CONFIG = """
# -- added by tests/test_reaper_unmonitored_hub.py
c.GPUSchedSpawner.profiles = [
    {"display_name": "1 H100", "slug": "h100", "gpus": 1, "gpu_models": ["H100"]},
    {"display_name": "1 L40S (unsampled node)", "slug": "dark", "gpus": 1, "gpu_models": ["L40S"]},
]
from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service

pass_idle_timeouts_to_service(c)  # the service learns these profiles
c.GPUSchedSpawner.queue_poll_interval = 0.3
c.Spawner.http_timeout = 60
c.Spawner.args = ["--GPUMonitor.interval=1"]
for _service in c.JupyterHub.services:  # dark1 is no local node: nothing samples it
    if _service["name"] == "gpusched":
        _service["command"] = [
            arg for arg in _service["command"] if arg != "--GPUSchedService.local_gpu_nodes=dark1"
        ] + ["--GPUSchedService.gpu_sample_interval=1"]
"""
WHY = "no source covers node dark1"


class DarkNodeHub(ts.HubRunner):
    def __init__(self):
        super().__init__()
        for name, text in (("cluster", CLUSTER), ("policy", POLICY)):
            path = hub_harness.readable_file(self.state_dir, f"test-{name}.yaml", text)
            self.env[f"GPUSCHED_{name.upper()}_FILE"] = str(path)
        simulated_gpus(self, EXTRA_CONFIG)


@pytest.fixture(scope="module")
def hub():
    with ts.module_hub(DarkNodeHub) as running:
        yield running.hub
        ts.stop_every_server(running.hub)


def unmonitored_gauge(hub) -> float:
    response = hub.service("GET", "metrics", hub.token("admin"))
    assert response.status_code == 200, response.text
    (line,) = [
        x for x in response.text.splitlines() if x.startswith("gpusched_unmonitored_servers")
    ]
    return float(line.split()[-1])


def wait_unmonitored(hub, user, timeout=15.0) -> dict:
    deadline = time.monotonic() + timeout
    while not (session := sessions(hub).get(user) or {}).get("unmonitored_since"):
        assert time.monotonic() < deadline, f"{user}'s server is not unmonitored: {session}"
        time.sleep(0.2)
    return session


def test_an_unsampled_server_is_reported_and_under_warn_told_and_kept(hub):
    try:
        _unsampled_under_warn(hub)
    finally:  # a failure here must not leave dark1's one GPU taken for the next test
        configure(hub, timeout_tier_2=None)
        ts.stop_every_server(hub)


def _unsampled_under_warn(hub):
    configure(hub, unmonitored="warn", timeout_tier_2=None, exempt_users=[])
    ts.start_server(hub, "alice", "h100")  # sampled: the control
    ts.start_server(hub, "bob", "dark")
    bob_job = ts.server_env(hub, "bob")["GPUSCHED_JOB_ID"]
    session = wait_unmonitored(hub, "bob")
    assert session["unmonitored_reason"] == WHY and session["measured_by"] is None
    assert sessions(hub)["alice"]["unmonitored_since"] is None
    assert sessions(hub)["alice"]["measured_by"] == "local (simulated)"
    # the gauge is set at the reaper's tick, api/reaper says it at the request: up to a tick later
    deadline = time.monotonic() + 10
    while unmonitored_gauge(hub) != 1:
        assert time.monotonic() < deadline, f"gauge {unmonitored_gauge(hub)}, not 1"
        time.sleep(0.2)
    deadline = time.monotonic() + 10
    while not (events := reaper_events(hub, bob_job, "reaper-unmonitored")):
        assert time.monotonic() < deadline, "no reaper-unmonitored event"
        time.sleep(0.2)
    (event,) = events
    assert event["data"]["reason"] == WHY and event["data"]["unmonitored"] == "warn"
    deadline = time.monotonic() + 10
    while not [n for n in notices(hub, "bob") or [] if n["kind"] == "unmonitored"]:
        assert time.monotonic() < deadline, f"no unmonitored notice: {notices(hub, 'bob')}"
        time.sleep(0.2)
    (notice,) = [n for n in notices(hub, "bob") if n["kind"] == "unmonitored"]
    assert "cannot be measured" in notice["message"] and WHY in notice["message"]
    assert (
        "not stopped for idleness" in notice["message"] and "admins were told" in notice["message"]
    )
    # a short idle timeout: the measured control is culled, the unmonitored server stays
    configure(hub, timeout_tier_2=2)
    alice_job = ts.server_env(hub, "alice")["GPUSCHED_JOB_ID"]
    ts.wait_job(hub, "alice", alice_job, ts.RELEASED, timeout=2 + 2 + 15)
    assert "" in ts.servers_of(hub, "bob") and not cull_events(hub, bob_job)
    assert len(reaper_events(hub, bob_job, "reaper-unmonitored")) == 1  # once per stretch
    assert not reaper_events(hub, bob_job, "reaper-warning")


def test_under_cull_an_unsampled_server_is_warned_then_culled(hub):
    configure(hub, unmonitored="cull", timeout_tier_2=None, warning_lead=3, exempt_users=[])
    try:
        ts.start_server(hub, "carol", "dark")
        job_id = ts.server_env(hub, "carol")["GPUSCHED_JOB_ID"]
        wait_unmonitored(hub, "carol")
        configure(hub, timeout_tier_2=2)
        seen, deadline = [], time.monotonic() + 3 + 20
        while "" in ts.servers_of(hub, "carol"):
            seen = notices(hub, "carol") or seen
            assert time.monotonic() < deadline, f"carol's server still runs: {sessions(hub)}"
            time.sleep(0.25)
        ts.wait_job(hub, "carol", job_id, ts.RELEASED, timeout=ts.RELEASE_TIMEOUT)
        (warning,) = reaper_events(hub, job_id, "reaper-warning")
        (cull,) = cull_events(hub, job_id)
        assert cull["data"]["reason"] == "unmonitored"
        assert cull["time"] - warning["time"] >= 3 - 1e-3  # the whole warning_lead (float sums)
        assert "cannot be measured" in warning["message"] and WHY in warning["message"]
        assert [n["message"] for n in seen if n["kind"] == "idle"] == [warning["message"]]
        assert not [n for n in seen if n["kind"] == "unmonitored"]  # cull: no "kept" notice
        (event,) = reaper_events(hub, job_id, "reaper-unmonitored")
        assert event["data"]["unmonitored"] == "cull"
    finally:
        configure(hub, unmonitored="warn", timeout_tier_2=None)
