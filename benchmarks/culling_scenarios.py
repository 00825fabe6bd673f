"""What benchmarks/bench_culling.py runs, without running it: the tools, the scenarios and the
cells they run, each tool's hub settings (the lines added to the demo config, the policy file),
what counts as wrong, and the table it prints. No I/O: tests/test_bench_culling.py checks it."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = ("gpusched", "idle-culler", "kernel-culling")
SCENARIOS = {  # scenario -> (user, profile, keeps the GPU busy)
    "gpu-busy-no-http": ("alice", "gpu-1", True),
    "gpu-memory-tab-open": ("bob", "gpu-1", False),
    "fully-idle": ("carol", "gpu-1", False),
    "cpu-only-idle": ("dave", "cpu", False),
    "gpu-background-thread": ("admin", "gpu-1", True),
}
EXTRA_USER = "dave"  # the fifth user: a Unix account like the demo users', allowed by the hub
STATE_PARENT = Path("/tmp/bench-culling")
FIRST_PORT = 8840  # each hub takes four: hub, hub API, proxy API, service
ACTIVITY_S = 10  # the hub's last_activity_interval and the servers' JUPYTERHUB_ACTIVITY_INTERVAL
NODE = "gpu1"
CLUSTER = f"nodes:\n  - {{name: {NODE}, gpus: 4, gpu_model: H100}}\n"
QUEUES = "queues:\n  bench: {guaranteed: 4, limit: 4}\n"  # names nobody: open to all
CPU_PROFILE = {"display_name": "CPU only", "slug": "cpu", "gpus": 0, "cpus": 1}
HELD_MEMORY_GB = 20
# api/reaper's session fields kept in the result; the times as seconds after the scenario began
REAPER_TIMES = ("idle_since", "last_report", "warned", "stop_at")
REAPER_FIELDS = (*REAPER_TIMES, "timeout", "gpus", "exempt", "last_sample", "ignored_reason")

BUSY_CELL = """\
import time
from jupyter_gpusched.backends.gpu import simulate_load
while True:  # the whole run: a training loop that never prints
    simulate_load(util=95, memory_gb=30, seconds=30)
    time.sleep(5)
"""
MEMORY_CELL = (
    "from jupyter_gpusched.backends.gpu import simulate_load\n"
    f"simulate_load(util=0, memory_gb={HELD_MEMORY_GB}, seconds=None)"
)
THREAD_CELL = """\
import threading, time
from jupyter_gpusched.backends.gpu import simulate_load
def _train():
    while True:
        simulate_load(util=95, memory_gb=30, seconds=30)
        time.sleep(5)
threading.Thread(target=_train, daemon=True).start()
"""


# -- pure helpers ----------------------------------------------------------------------------------
def cpu_profile_refusal() -> str | None:
    """Why this checkout's spawner refuses a ``gpus: 0`` profile, or None if it takes one."""
    from traitlets import TraitError

    from jupyter_gpusched.hub.profiles import normalize_profiles

    try:
        normalize_profiles([CPU_PROFILE])
    except (TraitError, ValueError) as exc:
        return str(exc)
    return None


def policy_text(tool: str, timeout: float) -> str:
    if tool == "gpusched":
        lead = round(timeout / 3, 1)
        return f"reaper:\n  timeout_tier_2: {timeout:g}s\n  warning_lead: {lead:g}s\n"
    return "reaper:\n  enabled: false\n"


def hub_config(tool: str, timeout: float, cull_every: float, with_cpu: bool, monitor: bool) -> str:
    """The lines this benchmark adds to the demo config for ``tool``'s hub; ``monitor``: the
    servers run gpusched's server extension (always for ``gpusched``)."""
    gpu = {"display_name": "1 GPU (tier 2)", "slug": "gpu-1", "gpus": 1}
    if tool == "gpusched":
        gpu["idle_timeout"] = timeout
    profiles = [gpu, *([CPU_PROFILE] if with_cpu else [])]
    lines = [
        "# -- added by benchmarks/bench_culling.py",
        f"c.GPUSchedSpawner.profiles = {profiles!r}",
        "from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service",
        "pass_idle_timeouts_to_service(c)",
        "c.GPUSchedSpawner.queue_poll_interval = 0.3",
        "c.Spawner.http_timeout = 60",
        "c.JupyterHub.log_level = 'INFO'",
        f"c.Authenticator.allowed_users = {{*c.Authenticator.allowed_users, {EXTRA_USER!r}}}",
        # activity reaches the hub in time for a short timeout (what idle-culler reads)
        f"c.JupyterHub.last_activity_interval = {ACTIVITY_S}",
        "c.Spawner.environment = {**c.Spawner.environment, "
        f"'JUPYTERHUB_ACTIVITY_INTERVAL': '{ACTIVITY_S}'}}",
    ]
    if tool == "gpusched":
        # the service's GPU samples and reads of the hub's activity as often as idle-culler's
        # --cull-every: the same chance to see a server idle
        args = [
            f"--GPUSchedService.gpu_sample_interval={cull_every:g}",
            f"--GPUSchedService.hub_activity_interval={cull_every:g}",
        ]
        lines += [
            "for _service in c.JupyterHub.services:",
            "    if _service['name'] == 'gpusched':",
            f"        _service['command'] = [*_service['command'], *{args!r}]",
        ]
    if tool != "gpusched" and not monitor:
        # the tool alone: no GPU monitor marking GPU-busy servers and kernels active
        lines.append("c.GPUSchedSpawner.enable_server_extension = False")
    if tool == "idle-culler":
        command = [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={timeout:.0f}",
            f"--cull-every={cull_every:.0f}",
            "--remove-named-servers=False",
        ]
        scopes = ["list:users", "read:users:activity", "read:servers", "delete:servers"]
        lines += [
            "c.JupyterHub.services = [*c.JupyterHub.services, "
            f"{{'name': 'idle-culler', 'command': {command!r}}}]",
            "c.JupyterHub.load_roles = [*c.JupyterHub.load_roles, "
            f"{{'name': 'idle-culler', 'scopes': {scopes!r}, 'services': ['idle-culler']}}]",
        ]
    elif tool == "kernel-culling":
        args = [
            f"--MappingKernelManager.cull_idle_timeout={timeout:.0f}",
            f"--MappingKernelManager.cull_interval={cull_every:.0f}",
            "--MappingKernelManager.cull_connected=True",
        ]
        lines.append(f"c.Spawner.args = {args!r}")
    return "\n".join(lines) + "\n"


def verdict(scenario: str, stopped: float | None, kernel_culled: float | None) -> bool:
    """Wrong: the tool stopped the server, or killed its kernel, while it kept the GPU busy."""
    return SCENARIOS[scenario][2] and (stopped is not None or kernel_culled is not None)


def table(rows: list[dict]) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, bool):
            return "WRONG" if value else "ok"
        return f"{value:g}" if isinstance(value, float) else str(value)

    head = ("tool", "scenario", "stopped_s", "kernel_culled_s", "warned_s", "wrong")
    keys = ("stopped", "kernel_culled", "warned", "wrong")
    body = [[r["tool"], r["scenario"], *(cell(r.get(k)) for k in keys)] for r in rows]
    widths = [max(len(x) for x in column) for column in zip(head, *body, strict=True)]
    lines = [
        "  ".join(x.ljust(w) for x, w in zip(line, widths, strict=True)) for line in [head, *body]
    ]
    notes = [f"  {r['tool']}/{r['scenario']}: {r['note']}" for r in rows if r.get("note")]
    return "\n".join(lines + notes)
