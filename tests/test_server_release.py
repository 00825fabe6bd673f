"""A notebook server's GPUs are free only when nothing of it runs (service/server_stops.py),
under a real hub: JupyterHub, configurable-http-proxy, the scheduler service and
GPUSchedSpawner's real single-user servers on the test cluster of ``tests/test_spawner.py``
(4 GPUs; its ``HubRunner`` and helpers), with the simulated GPU backend, so that the service
sees the servers' node as its own machine and checks their processes.

* a cancel of alice's server job through the service's API (the widget's Cancel): the job stays
  running, ``stopping: cancelled``, and its GPUs stay held (a queued job stays pending) while the
  server's process lives; the hub stops the server at once; then the job is cancelled, saying
  by whom, and the queued job starts;
* a stop through the hub by someone else (an admin) says "server stopped through the hub", not
  "stopped by alice" (JupyterHub does not tell the spawner who asked);
* a server found dead by the hub's poll says so;
* a process the server left behind (the job's id in its environment, outside the server's
  process tree) keeps the GPUs held; after ``notebook_stop_wait`` the service kills it and only
  then frees them.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time

import hub_harness
import psutil
import pytest
import test_spawner as ts

STOP_WAIT = 4.0  # the service's notebook_stop_wait here
EXTRA_CONFIG = (
    ts.EXTRA_CONFIG
    + """
# -- added by tests/test_server_release.py
c.Spawner.poll_interval = 1  # the hub notices a dead server within a second or two
"""
    + hub_harness.SERVICE_ARGS_CONFIG.format(
        service=hub_harness.SERVICE,
        service_args=[f"--GPUSchedService.notebook_stop_wait={STOP_WAIT}"],
    )
)


class ReleaseHub(ts.HubRunner):
    def __init__(self):
        super().__init__()
        self.env.update(
            GPUSCHED_GPU_BACKEND="simulated",
            GPUSCHED_SIM_CLUSTER=self.env["GPUSCHED_CLUSTER_FILE"],
        )
        config = self.config.read_text()
        self.config.write_text(config.replace(ts.EXTRA_CONFIG, EXTRA_CONFIG))


@pytest.fixture(scope="module")
def runner():
    with ts.module_hub(ReleaseHub) as running:
        yield running


@pytest.fixture
def hub(runner):
    yield runner.hub
    ts.stop_every_server(runner.hub)
    admin = runner.hub.token("admin")
    jobs = runner.hub.service("GET", "api/jobs?state=running&state=pending", admin).json()
    for job in jobs["jobs"]:
        runner.hub.service("DELETE", f"api/jobs/{job['id']}", admin)
    ts.wait_free(runner.hub, 4, timeout=15)


def queue_batch_job(hub, user, gpus) -> str:
    body = {"command": "sleep 300", "gpus": gpus, "name": "next", "walltime": "10m"}
    response = hub.service("POST", "api/jobs", hub.token(user), json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def held_until_gone(hub, user, job_id, pids, waiting_job, timeout) -> dict:
    """Until ``job_id`` has ended: at every look, while any of ``pids`` lives, the job is
    running and its GPUs are not free (``waiting_job`` stays pending). Returns the ended job."""
    deadline = time.monotonic() + timeout
    seen_alive = False
    while True:
        job = ts.service_job(hub, user, job_id)
        waiting = ts.service_job(hub, "bob", waiting_job)["state"]
        free = ts.free_gpus(hub)
        if any(alive(pid) for pid in pids):  # looked at after the job: alive then too
            seen_alive = True
            assert job["state"] == "running" and job["stopping"] == "cancelled", job
            assert waiting == "pending" and free == 2, (waiting, free)
        elif job["state"] != "running":
            assert seen_alive, "the server was gone before the first look"
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
        time.sleep(0.05)


def test_a_cancelled_servers_gpus_are_held_until_its_process_is_gone(hub):
    ts.start_server(hub, "alice", "gpu-2")
    state = ts.spawner_state(hub, "alice")
    job_id, pid = state["gpusched"]["job_id"], state["pid"]
    waiting = queue_batch_job(hub, "bob", 4)  # all four GPUs: waits for alice's two

    response = hub.service("DELETE", f"api/jobs/{job_id}", hub.token("alice"))  # the widget
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "running", response.json()
    assert response.json()["stopping"] == "cancelled", response.json()
    job = held_until_gone(hub, "alice", job_id, [pid], waiting, timeout=15)
    assert job["state"] == "cancelled", job
    assert job["message"] == "cancelled by alice through the scheduler API", job
    ts.wait_gone(hub, "alice", timeout=10)  # the hub stopped it, not its poll 30 s later
    ts.wait_job(hub, "bob", waiting, {"running"}, timeout=10)


def test_a_stop_through_the_hub_does_not_name_the_user(hub):
    ts.start_server(hub, "alice", "gpu-1")
    job_id = ts.spawner_state(hub, "alice")["gpusched"]["job_id"]
    response = ts.hub_api(hub, "DELETE", ts.server_path("alice"), hub.token("admin"))
    assert response.status_code in (202, 204), response.text
    job = ts.wait_job(hub, "alice", job_id, ts.RELEASED, timeout=15)
    assert job["message"] == "server stopped through the hub", job

    ts.start_server(hub, "alice", "gpu-1")
    state = ts.spawner_state(hub, "alice")
    os.kill(state["pid"], signal.SIGKILL)  # a crash: the hub's poll finds it
    job = ts.wait_job(hub, "alice", state["gpusched"]["job_id"], ts.RELEASED, timeout=15)
    assert job["message"] == "the server process exited (status -9)", job
    ts.wait_gone(hub, "alice", timeout=10)


def test_a_process_left_by_the_server_holds_its_gpus_until_the_service_kills_it(hub):
    ts.start_server(hub, "alice", "gpu-2")
    state = ts.spawner_state(hub, "alice")
    job_id = state["gpusched"]["job_id"]
    waiting = queue_batch_job(hub, "bob", 4)
    account = pwd.getpwnam("alice")
    hub_api = ts.server_env(hub, "alice")["JUPYTERHUB_API_URL"]

    def escaped(api_url):  # a process escaped from a server's tree (a kernel's nohup)
        return subprocess.Popen(
            ["sleep", "300"],
            env={"PATH": os.defpath, "GPUSCHED_JOB_ID": job_id, "JUPYTERHUB_API_URL": api_url},
            user=account.pw_uid,
            group=account.pw_gid,
            start_new_session=True,
        )

    left = escaped(hub_api)
    # another hub's server on this host with the same job id (ids are numbered per service):
    # not this server's, never killed
    other = escaped("http://127.0.0.1:1/hub/api")
    try:
        began = time.monotonic()
        ts.stop_server(hub, "alice")  # the hub's stop: the spawner releases the job
        assert left.poll() is None
        job = ts.service_job(hub, "alice", job_id)
        assert job["state"] == "running" and job["stopping"] == "cancelled", job
        job = held_until_gone(hub, "alice", job_id, [left.pid], waiting, timeout=STOP_WAIT + 15)
        assert time.monotonic() - began >= STOP_WAIT - 0.5  # killed only after the wait
        assert left.wait(5) == -signal.SIGKILL
        assert job["state"] == "cancelled", job
        assert job["message"] == "server stopped through the hub", job
        ts.wait_job(hub, "bob", waiting, {"running"}, timeout=10)
        assert other.poll() is None, "another hub's process with the same job id was killed"
    finally:
        for process in (left, other):
            if process.poll() is None:
                process.kill()
                process.wait()
