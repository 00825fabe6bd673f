"""The GPU monitor of the server extension, in a real jupyter-server with real kernels and the
simulated GPU backend: load put on a GPU from inside one kernel is attributed to that kernel only,
the server is marked active while it lasts, and the samples are reported to the service.

pytest-jupyter's fixtures are imported here only (see tests/test_serverext.py for why).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the fixtures, for this module only)

from jupyter_gpusched.backends.gpu import SimulatedTelemetry, simulate_load, stop_load
from jupyter_gpusched.notebook.serverext.monitor import ACTIVITY_KEY, SETTINGS_KEY, GPUMonitor

NODE = "mon-node"


@pytest.fixture
def sim_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSCHED_SIM_GPU_DIR", str(tmp_path / "gpus"))
    monkeypatch.setenv("GPUSCHED_NODE", NODE)
    monkeypatch.setenv("GPUSCHED_GPU_BACKEND", "simulated")
    monkeypatch.setenv("GPUSCHED_SIM_GPUS", "4")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,2")
    monkeypatch.delenv("GPUSCHED_SERVICE_URL", raising=False)
    monkeypatch.setenv("GPUSCHED_JOB_ID", "j-000042")
    return tmp_path / "gpus"


@pytest.fixture
def jp_server_config(sim_env):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpusched.notebook.serverext": True}},
        "GPUMonitor": {"interval": 0.5},
    }


@pytest.fixture
def loop_run(jp_asyncio_loop):
    return jp_asyncio_loop.run_until_complete


async def _execute(kernel, code: str) -> None:
    client = kernel.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive(code, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
    finally:
        client.stop_channels()


def test_load_in_one_kernel_is_attributed_to_it_only(jp_fetch, jp_serverapp, loop_run):
    manager = jp_serverapp.kernel_manager
    first = loop_run(manager.start_kernel())
    second = loop_run(manager.start_kernel())
    monitor = jp_serverapp.web_app.settings[SETTINGS_KEY]
    assert monitor.interval == 0.5
    jp_serverapp.web_app.settings.get("last_activity_times", {}).pop(ACTIVITY_KEY, None)
    code = (
        "from jupyter_gpusched.backends.gpu import simulate_load\n"
        "simulate_load(util=70, memory_gb=3, seconds=120)\n"
    )
    loop_run(_execute(manager.get_kernel(first), code))

    def kernels():
        return json.loads(loop_run(jp_fetch("gpusched", "api", "kernels")).body)

    deadline = time.time() + 30
    while time.time() < deadline:
        loop_run(asyncio.sleep(0.5))
        data = kernels()
        if data["kernels"].get(first, {}).get("utilization", 0) > 0:
            break
    one, two = data["kernels"][first], data["kernels"][second]
    assert one["utilization"] == pytest.approx(140.0)  # 70% on each of GPUs 1 and 2
    assert one["memory_gb"] == pytest.approx(6.0)
    assert one["gpus"] == [1, 2] and one["last_gpu_use"] is not None
    assert two["utilization"] == 0 and two["memory_gb"] == 0 and two["last_gpu_use"] is None
    assert data["server"]["utilization"] == pytest.approx(140.0)
    assert [d["index"] for d in data["devices"]] == [1, 2]
    assert data["job_id"] == "j-000042"
    # the server counts as active while its GPUs are busy
    assert ACTIVITY_KEY in jp_serverapp.web_app.settings["last_activity_times"]
    # the load ends: the kernel keeps its last use, utilization drops to 0
    kernel_pid = manager.get_kernel(first).provisioner.pid
    stop_load(node=NODE, pid=kernel_pid)
    deadline = time.time() + 10
    while time.time() < deadline:
        loop_run(asyncio.sleep(0.5))
        data = kernels()
        if data["kernels"][first]["utilization"] == 0:
            break
    assert data["kernels"][first]["utilization"] == 0
    assert data["kernels"][first]["last_gpu_use"] == one["last_gpu_use"] or (
        data["kernels"][first]["last_gpu_use"] >= one["last_gpu_use"]
    )
    loop_run(manager.shutdown_kernel(first))
    loop_run(manager.shutdown_kernel(second))


def test_other_processes_are_not_attributed(sim_env):
    """A load of the server's own process counts for the server, not for a kernel; a load of a
    process outside the server's tree (PID 1 here) is not the server's, though its GPU is busy."""
    telemetry = SimulatedTelemetry(node=NODE, gpus=4, state_dir=sim_env)
    monitor = GPUMonitor(serverapp=None, telemetry=telemetry)
    try:
        simulate_load(util=50, memory_gb=1, seconds=30, gpus=[1], node=NODE, state_dir=sim_env)
        snapshot = monitor.sample()
        assert snapshot["server"]["utilization"] == pytest.approx(50)
        assert snapshot["server"]["last_gpu_use"] is not None
        assert snapshot["kernels"] == {}
        stop_load(node=NODE, state_dir=sim_env)
        simulate_load(util=60, gpus=[2], node=NODE, pid=1, state_dir=sim_env)
        snapshot = monitor.sample()
        assert snapshot["server"]["utilization"] == 0
        device = next(d for d in snapshot["devices"] if d["index"] == 2)
        assert device["utilization"] == pytest.approx(60)
        assert [d["index"] for d in snapshot["devices"]] == [1, 2]  # CUDA_VISIBLE_DEVICES
    finally:
        stop_load(node=NODE, state_dir=sim_env)
        stop_load(node=NODE, pid=1, state_dir=sim_env)
