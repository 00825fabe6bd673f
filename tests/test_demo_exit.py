"""Ctrl-C on ``make demo`` stops what the demo started (GPUSCHED_DEMO_STOP_ALL=1).

The demo configuration as ``make demo`` runs it (``hub_config/jupyterhub_config.py`` with the
demo cluster and queues, simulated GPUs, ``GPUSCHED_DEMO_STOP_ALL=1``) under a real hub: alice
runs a notebook server, bob a batch job (``sleep 600``), carol has one waiting (her queue's
limit); a SIGINT to the hub (what Ctrl-C sends)
makes the hub, the proxy and the service exit within JupyterHub's wait for its service, and
leaves no notebook server, no job process and no service; the jobs are recorded ``cancelled``
with the reason "the demo stopped", and the hub's log has one line for each. A process of
another demo on the host whose environment names the same job id (job ids are numbered per
service: every demo's alice may have a ``j-000001``) is not this demo's, and outlives the stop.

Without the variable a hub stop keeps servers (and their allocations): that is
``tests/test_spawner.py::test_a_hub_restart_keeps_servers_and_allocations`` and
``tests/test_reaper_hub.py::test_a_server_that_outlived_a_hub_restart_keeps_reporting_and_is_culled``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import sqlite3
import subprocess
import time

import hub_harness
import psutil
import pytest
import test_spawner as ts

DEMO_ENV = {
    "GPUSCHED_CLUSTER_FILE": str(hub_harness.ROOT / "hub_config" / "demo-cluster.yaml"),
    "GPUSCHED_QUEUE_FILE": str(hub_harness.ROOT / "hub_config" / "demo-queues.yaml"),
    "GPUSCHED_GPU_BACKEND": "simulated",
    "GPUSCHED_DEMO_STOP_ALL": "1",
}
REASON = "the demo stopped (Ctrl-C on make demo)"
HUB_SERVICE_WAIT = 30.0  # JupyterHub: SIGINT to a managed service, then SIGTERM this much later


@pytest.fixture(scope="module")
def demo_hub():
    with hub_harness.running_hub(env=DEMO_ENV) as hub:
        yield hub


def processes_of_jobs(hub, job_ids: set[str]) -> list[psutil.Process]:
    """Every live process of ``hub`` whose environment names one of ``job_ids`` (servers,
    kernels, jobs). This hub's: its simulated GPUs' folder in their environment (other hubs on
    the host number their jobs from j-000001 too)."""
    found = []
    load_dir = f"{hub.state_dir}-sim-gpus"
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.status() == psutil.STATUS_ZOMBIE:
                continue
            environ = process.environ()
            ours = environ.get("GPUSCHED_SIM_GPU_DIR") == load_dir
            if ours and environ.get("GPUSCHED_JOB_ID") in job_ids:
                found.append(process)
    return found


def the_service(hub) -> psutil.Process:
    for process in hub_harness._descendants(hub.process.pid):
        with contextlib.suppress(psutil.Error):
            command = process.cmdline()
            if "jupyter_gpusched" in command and "serve" in command:
                return process
    raise AssertionError("the gpusched service is not running")


def other_demos_process(user: str, job_id: str) -> subprocess.Popen:
    """A process of ``user`` that another demo's server would have: the same job id, another
    hub's API (``JUPYTERHUB_API_URL``) and service."""
    port = hub_harness.free_port()
    env = {
        "PATH": os.defpath,
        "GPUSCHED_JOB_ID": job_id,
        "JUPYTERHUB_API_URL": f"http://127.0.0.1:{port}/hub/api",
        "GPUSCHED_SERVICE_URL": f"http://127.0.0.1:{port + 1}/services/gpusched/",
    }
    ids = {}
    if os.geteuid() == 0:
        account = pwd.getpwnam(user)
        ids = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    return subprocess.Popen(["sleep", "300"], env=env, cwd="/", **ids)


def alive(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return process.status() != psutil.STATUS_ZOMBIE
    return False


def test_ctrl_c_stops_the_demos_servers_and_jobs_then_the_hub_exits(demo_hub):
    hub = demo_hub
    ts.start_server(hub, "alice", "gpu-1")
    alice_job = ts.spawner_state(hub, "alice")["gpusched"]["job_id"]
    server = psutil.Process(ts.spawner_state(hub, "alice")["pid"])
    body = {"command": "sleep 600", "gpus": 1}
    response = hub.service("POST", "api/jobs", hub.token("bob"), json=body)
    assert response.status_code == 201, response.text
    bob_job = ts.wait_job(hub, "bob", response.json()["id"], {"running"})["id"]
    body = {"command": "sleep 600", "gpus": 4}  # ops: at most 4 GPUs, so the second waits
    carol_jobs = [hub.service("POST", "api/jobs", hub.token("carol"), json=body) for _ in "12"]
    assert [r.status_code for r in carol_jobs] == [201, 201], [r.text for r in carol_jobs]
    carol_job = carol_jobs[1].json()["id"]
    assert ts.service_job(hub, "carol", carol_job)["state"] == "pending"
    jobs = {alice_job, bob_job, carol_jobs[0].json()["id"], carol_job}
    deadline = time.monotonic() + 60  # the runner starts as bob (a loaded machine: seconds)
    while len(processes_of_jobs(hub, {bob_job})) < 2:  # the job's runner and its `sleep 600`
        assert time.monotonic() < deadline, "bob's job has no processes"
        time.sleep(0.1)
    watched = [server, the_service(hub), *processes_of_jobs(hub, jobs)]
    other = other_demos_process("alice", alice_job)
    proxy = hub_harness._proxy_pid(hub.state_dir)
    assert proxy is not None
    watched.append(psutil.Process(proxy))
    try:
        started = time.monotonic()
        hub.process.send_signal(signal.SIGINT)  # what Ctrl-C on `make demo` sends
        hub.process.wait(HUB_SERVICE_WAIT + 30)
        took = time.monotonic() - started
        _, left = psutil.wait_procs(watched, timeout=5)
        left = [p for p in left if alive(p)] + [
            p for p in processes_of_jobs(hub, jobs) if p not in watched and p.pid != other.pid
        ]
        assert not left, f"left running after the hub exited: {left}\n{hub.log_tail(80)}"
        # the service ended its work well before the hub would have sent it SIGTERM
        assert took < HUB_SERVICE_WAIT - 5, f"the hub took {took:.1f} s to exit"
        assert other.poll() is None, "the service killed another demo's process"

        database = hub.state_dir / "gpusched" / "gpusched.sqlite"
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT id, state, message FROM jobs").fetchall()
        ended = {job_id: (state, message) for job_id, state, message in rows}
        assert ended[alice_job] == ("cancelled", REASON), ended
        state, message = ended[bob_job]
        assert state == "cancelled" and message.startswith(REASON), ended
        assert ended[carol_job] == ("cancelled", REASON), ended

        log = hub.log_path.read_text(errors="replace")
        assert f"gpusched: stopped alice's notebook server ({alice_job}): cancelled" in log
        assert f"gpusched: stopped bob's batch job {bob_job} (sleep 600): cancelled" in log
        assert f"gpusched: stopped carol's pending batch job {carol_job} (sleep 600)" in log
    finally:  # what a failure left: the hub is gone, so the harness cannot find it any more
        for process in [*watched, *processes_of_jobs(hub, jobs)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        other.kill()
        other.wait()
