"""Two demo hubs on one host (``hub_config/jupyterhub_config.py`` twice, each with its own state
directory, on the simulated GPU backend, with the same cluster file and so the same node names):
each hub's simulated GPUs are its own. A rogue GPU process of one demo is reported and killed by
that demo's service, never reported or killed by the other's, whatever its admin sets."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import hub_harness
import pytest
import requests

from jupyter_gpusched.backends.gpu.simulated_loads import default_state_dir
from jupyter_gpusched.files import load_cluster

# The service checks for rogue processes at each poll (1 s) once this interval has passed.
EXTRA_CONFIG = """
c.JupyterHub.services[0]["command"] += [
    "--GPUSchedService.rogue_check_interval=0.2",
    "--GPUSchedService.rogue_kill_grace=1",
]
"""
ROGUE = (
    "import time; from jupyter_gpusched.backends.gpu import simulate_load; "
    "simulate_load(util=60, memory_gb=2, seconds=300, gpus=[5], node={node!r}, state_dir={dir!r});"
    " print('loaded', flush=True); time.sleep(300)"
)


def load_dir_of(hub) -> str:
    """Where the hub's service reads the simulated GPUs' loads (its environment's folder, else
    the backend's default)."""
    for process in hub_harness._descendants(hub.process.pid):
        with contextlib.suppress(Exception):
            if "serve" in process.cmdline() and "jupyter_gpusched" in process.cmdline():
                return process.environ().get("GPUSCHED_SIM_GPU_DIR") or str(default_state_dir())
    raise AssertionError("the gpusched service is not running")


def rogues(hub) -> dict:
    response = hub.service("GET", "api/rogue-processes", hub.token("admin"))
    assert response.status_code == 200, response.text
    return response.json()


def set_mode(hub, mode: str) -> None:
    response = hub.service("PUT", "api/reaper", hub.token("admin"), json={"rogue_processes": mode})
    assert response.status_code == 200, response.text


def test_a_rogue_process_of_one_demo_is_never_reported_or_killed_by_another(monkeypatch):
    monkeypatch.delenv("GPUSCHED_SIM_GPU_DIR", raising=False)  # each hub's own default
    env = {"GPUSCHED_GPU_BACKEND": "simulated"}
    node = load_cluster(hub_harness.ROOT / "hub_config" / "cluster.yaml").nodes[0].name
    with contextlib.ExitStack() as stack:
        one = stack.enter_context(hub_harness.running_hub(env, EXTRA_CONFIG))
        other = stack.enter_context(hub_harness.running_hub(env, EXTRA_CONFIG))
        assert load_dir_of(one) == f"{one.state_dir}-sim-gpus"
        assert load_dir_of(other) != load_dir_of(one)
        assert node in rogues(other)["watched_nodes"]  # the same node names in both

        code = ROGUE.format(node=node, dir=load_dir_of(one))
        rogue = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        stack.callback(lambda: (rogue.kill(), rogue.wait()))
        assert rogue.stdout.readline().strip() == "loaded"

        deadline = time.monotonic() + 30
        while rogue.pid not in {p["pid"] for p in rogues(one)["processes"]}:
            assert time.monotonic() < deadline, f"not reported by its own demo: {rogues(one)}"
            time.sleep(0.3)

        set_mode(other, "kill")  # an admin of the other demo: it is not theirs to kill
        time.sleep(4)  # several checks of the other service (each poll, every second)
        assert rogues(other)["processes"] == [], rogues(other)
        events = other.service("GET", "api/events", other.token("admin"))
        assert events.status_code == 200, events.text
        kinds = {event["kind"] for event in events.json()["events"]}
        assert not kinds & {"rogue-process", "rogue-killed"}, kinds
        assert rogue.poll() is None

        set_mode(one, "kill")  # its own demo's admin: killed
        try:
            rogue.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"its own demo did not kill it: {rogues(one)}")
        with contextlib.suppress(requests.RequestException):
            set_mode(other, "report")
