"""The pure parts of benchmarks/bench_culling.py (benchmarks/culling_scenarios.py): each tool's
hub gets the settings the benchmark promises (read back through the project's own policy loader
and a traitlets config), and only stopping GPU work counts as wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from traitlets.config import Config

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import culling_scenarios as bc

from jupyter_gpusched.core.reaper_settings import validate
from jupyter_gpusched.files import load_policy, read_yaml


def _hub(tool: str, monitor: bool = False) -> Config:
    """The benchmark's lines run on a config shaped like the demo's."""
    c = Config()
    c.JupyterHub.services = [{"name": "gpusched", "command": ["python", "-m", "jupyter_gpusched"]}]
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self"]}]
    c.Spawner.environment = {"GPUSCHED_SIM_GPU_DIR": "/tmp/x"}
    c.Authenticator.allowed_users = {"alice", "bob", "carol", "admin"}
    exec(bc.hub_config(tool, 30.0, 5.0, with_cpu=False, monitor=monitor), {"c": c})
    return c


@pytest.mark.parametrize("tool", bc.TOOLS)
def test_the_policy_file_turns_the_reaper_on_only_for_gpusched(tool, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(bc.policy_text(tool, 30.0))
    load_policy(path)  # the service would start with it (a bad reaper: section exits 2)
    reaper = validate(read_yaml(path)["reaper"])
    if tool == "gpusched":
        assert reaper["enabled"] and reaper["timeout_tier_2"] == 30 and reaper["warning_lead"] == 10
    else:
        assert reaper["enabled"] is False


def test_each_hub_runs_its_tool_with_the_same_timeout():
    gpusched = _hub("gpusched")
    command = gpusched.JupyterHub.services[0]["command"]
    assert any(arg.endswith("gpu-1=30") for arg in command), command  # the profile's timeout
    assert "enable_server_extension" not in gpusched.GPUSchedSpawner

    culler = _hub("idle-culler")
    service = next(s for s in culler.JupyterHub.services if s["name"] == "idle-culler")
    assert service["command"][-3:] == [
        "--timeout=30",
        "--cull-every=5",
        "--remove-named-servers=False",
    ]
    role = next(r for r in culler.JupyterHub.load_roles if r["name"] == "idle-culler")
    assert "delete:servers" in role["scopes"] and role["services"] == ["idle-culler"]
    assert culler.GPUSchedSpawner.enable_server_extension is False  # the tool alone
    assert culler.JupyterHub.last_activity_interval == bc.ACTIVITY_S
    assert culler.Spawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == str(bc.ACTIVITY_S)
    assert culler.Spawner.environment["GPUSCHED_SIM_GPU_DIR"] == "/tmp/x"  # kept
    assert "dave" in culler.Authenticator.allowed_users

    kernels = _hub("kernel-culling", monitor=True)
    assert kernels.Spawner.args == [
        "--MappingKernelManager.cull_idle_timeout=30",
        "--MappingKernelManager.cull_interval=5",
        "--MappingKernelManager.cull_connected=True",
    ]
    assert "enable_server_extension" not in kernels.GPUSchedSpawner  # with gpusched's monitor
    assert [s["name"] for s in kernels.JupyterHub.services] == ["gpusched"]


def test_only_stopping_gpu_work_is_wrong():
    assert bc.verdict("gpu-busy-no-http", stopped=31.0, kernel_culled=None)
    assert bc.verdict("gpu-background-thread", stopped=None, kernel_culled=35.0)
    assert not bc.verdict("gpu-background-thread", stopped=None, kernel_culled=None)
    assert not bc.verdict("gpu-memory-tab-open", stopped=40.0, kernel_culled=35.0)
    assert not bc.verdict("fully-idle", stopped=30.0, kernel_culled=None)
