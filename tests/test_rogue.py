"""Rogue GPU use (service/rogue.py): an in-process service watching its node's simulated GPUs
finds a process started outside the scheduler and a job's process escaping its allocation,
reports each once (audit event, admin listing, gauge), leaves honest jobs alone, and kills the
rogue process once an admin sets ``rogue_processes: kill`` at run time."""

from __future__ import annotations

import subprocess
import sys

import pytest
from service_helpers import start_service, wait_job, wait_until

from jupyter_gpusched.backends.gpu.telemetry import short_hostname

CLUSTER = {"nodes": [{"name": "gpu1", "gpus": 8, "gpu_model": "h100"}]}
LOAD = (
    "import time; from jupyter_gpusched.backends.gpu import simulate_load; "
    "simulate_load(util=70, memory_gb=3, seconds=300{gpus}); time.sleep(300)"
)


@pytest.fixture
def sim_gpus(tmp_path, monkeypatch):
    directory = tmp_path / "sim-gpus"
    directory.mkdir(mode=0o1777)
    monkeypatch.setenv("GPUSCHED_GPU_BACKEND", "simulated")
    monkeypatch.setenv("GPUSCHED_SIM_GPU_DIR", str(directory))
    return directory


def _rogues(view: dict) -> dict[int, dict]:
    return {p["pid"]: p for p in view["processes"]}


async def test_rogue_processes_are_reported_once_then_killed_when_an_admin_says_so(
    tmp_path, sim_gpus
):
    service = await start_service(
        tmp_path / "service",
        cluster=CLUSTER,
        queues=None,
        local_gpu_nodes=["gpu1"],
        rogue_check_interval=0.2,
        rogue_kill_grace=1.0,
    )
    outsider = subprocess.Popen(
        [sys.executable, "-c", LOAD.format(gpus=", gpus=[6]")],
        env={
            "PATH": "/usr/bin:/bin",
            "GPUSCHED_NODE": "gpu1",
            "GPUSCHED_SIM_GPU_DIR": str(sim_gpus),
        },
    )
    try:
        admin, alice = service.client("admin"), service.client("alice")
        # the job's environment is the scheduler's: the load directory goes on the line
        run = f"GPUSCHED_SIM_GPU_DIR={sim_gpus} {sys.executable} -c"
        honest_command = f'{run} "{LOAD.format(gpus="")}"'
        escaping_command = f'{run} "{LOAD.format(gpus=", gpus=[7]")}"'
        _, honest = await alice.post("api/jobs", {"gpus": 1, "command": honest_command})
        _, escaping = await alice.post("api/jobs", {"gpus": 1, "command": escaping_command})
        for job in (honest, escaping):
            await wait_job(alice, job["id"], "running")

        async def both_found():
            status, view = await admin.get("api/rogue-processes")
            assert status == 200, view
            return view if len(view["processes"]) >= 2 else None

        view = await wait_until(both_found, 30, what="two rogue processes")
        assert view["watched_nodes"] == ["gpu1"] and view["mode"] == "report"
        found = _rogues(view)
        assert found[outsider.pid]["reason"] == "no-job"
        assert found[outsider.pid]["device_index"] == 6
        escaped = next(p for p in found.values() if p["job_id"] == escaping["id"])
        assert escaped["reason"] == "outside-allocation" and escaped["device_index"] == 7
        assert len(found) == 2, found  # the honest job's process is not there
        assert outsider.poll() is None  # reported, not killed

        status, _ = await alice.get("api/rogue-processes")
        assert status == 403
        checked = service.live.rogue_watch._checked
        await wait_until(lambda: service.live.rogue_watch._checked > checked, what="a check")
        status, events = await admin.get("api/events", params={"kind": "rogue-process"})
        pids = [e["data"]["pid"] for e in events["events"]]
        assert sorted(pids) == sorted(found), events  # once each, however many checks
        assert service.app.metrics.registry.get_sample_value("gpusched_rogue_processes") == 2

        status, _ = await admin.put("api/reaper", {"rogue_processes": "kill"})
        assert status == 200
        await wait_until(lambda: outsider.poll() is not None, 30, what="the kill")
        status, events = await admin.get("api/events", params={"kind": "rogue-killed"})
        killed = {e["data"]["pid"] for e in events["events"]}
        assert outsider.pid in killed
        status, view = await alice.get(f"api/jobs/{honest['id']}")
        assert view["state"] == "running"  # an honest job is never touched
    finally:
        if outsider.poll() is None:
            outsider.kill()
        outsider.wait()
        await service.stop()


async def test_no_local_node_no_checks(tmp_path, sim_gpus):
    # the default watches the node named like this host, and the cluster has none
    cluster = {"nodes": [{"name": "not-" + short_hostname(), "gpus": 8, "gpu_model": "h100"}]}
    service = await start_service(tmp_path / "service", cluster=cluster, queues=None)
    try:
        status, view = await service.client("admin").get("api/rogue-processes")
        assert status == 200
        assert view == {"watched_nodes": [], "mode": "report", "processes": []}
    finally:
        await service.stop()


async def test_an_unknown_local_node_is_a_config_error(tmp_path, sim_gpus):
    from jupyter_gpusched.core.errors import ConfigError

    with pytest.raises(ConfigError):
        await start_service(
            tmp_path / "service", cluster=CLUSTER, queues=None, local_gpu_nodes=["nope"]
        )
