"""The service's settings about notebook servers and the GPUs of its own machine.

What the hub's profiles promise (their idle timeouts and shapes), how long a server's stop is
waited for, the service's own GPU telemetry and samples (which the idle reaper decides on), the
check for rogue GPU processes, and the reads of the hub's activity of servers. Traits of
``GPUSchedService``, which inherits them (set as ``c.GPUSchedService.local_gpu_nodes`` and the
like; not a Configurable of its own, so that they have one name only, as gpu_sources.py's);
apart from app.py, which builds the parts these configure, to keep each a readable size.
"""

from __future__ import annotations

from traitlets import Dict, Float, HasTraits, List, Unicode, default

from ..backends.gpu.telemetry import configured_backend
from .rogue import SYSTEM_PROCESSES


class NotebookServerSettings(HasTraits):
    profile_idle_timeouts = Dict(
        {},
        help="The idle_timeout of each of the hub's GPU profiles (slug -> seconds), which the "
        "spawn form promises: the reaper applies it to that profile's servers, unless an admin "
        "sets profile_timeouts for the profile. hub_config/jupyterhub_config.py passes it from "
        "GPUSchedSpawner.profiles (jupyter_gpusched.hub.profiles.pass_idle_timeouts_to_service).",
    ).tag(config=True)
    profile_shapes = Dict(
        {},
        help="""The GPUs and tier of each of the hub's profiles (slug -> {"gpus": N, "tier": T},
        or that as JSON on the command line): a notebook job that names a profile must match
        it (400 otherwise), so that nobody claims a profile's idle timeout or exemption by hand.
        Passed by jupyter_gpusched.hub.profiles.pass_idle_timeouts_to_service; empty: not
    checked.""",
    ).tag(config=True)
    notebook_stop_wait = Float(
        30.0,
        help="After asking the hub to stop a notebook server (cancelled, pre-empted, culled), "
        "how long to wait for its spawner's release; then the service kills what is left of "
        "the server on this machine and ends its job (service/server_stops.py).",
    ).tag(config=True)
    gpu_backend = Unicode(
        help="""The service's own GPU telemetry: 'auto' or 'nvml' (NVIDIA's NVML), or
        'simulated': the cluster's GPUs are the simulated ones (the demo, the tests). Default
        $GPUSCHED_GPU_BACKEND, else 'auto'. The reaper acts on GPU samples measured by NVML or
        DCGM, and on simulated ones only when this is 'simulated' (docs/gpu.md).""",
    ).tag(config=True)
    local_gpu_nodes = List(
        Unicode(),
        default_value=None,
        allow_none=True,
        help="""Nodes of the cluster file whose GPUs this machine sees (through gpu_backend):
        the idle reaper's GPU samples of them are taken here (service/gpu_sampling.py), the
        service checks them for rogue GPU processes every
        rogue_check_interval (see service/rogue.py; the reaper setting rogue_processes says
        report, kill or off), and a notebook server placed on them is over only when its
        processes are gone here (service/server_stops.py). Default: the node named like
        this host, if the cluster has one; [] turns the checks off.""",
    ).tag(config=True)
    gpu_sample_interval = Float(
        10.0,
        min=0.1,
        help="""Seconds between the service's GPU samples of the nodes of running notebook
        servers, which the idle reaper decides on (service/gpu_sampling.py).""",
    ).tag(config=True)
    rogue_check_interval = Float(
        30.0, help="Seconds between checks of the local GPUs for rogue processes."
    ).tag(config=True)
    rogue_ignore_processes = List(
        Unicode(),
        default_value=list(SYSTEM_PROCESSES),
        help="""Names of GPU processes that are the machine's, not a user's, and never reported
        or killed as rogue (a display server, DCGM, the MPS daemon ...).""",
    ).tag(config=True)
    hub_activity_interval = Float(
        60.0,
        help="""Seconds between reads of the hub's last_activity of the users' servers, by which
        the reaper judges servers without GPUs (service/hub_activity.py).""",
    ).tag(config=True)
    rogue_kill_grace = Float(
        10.0,
        help="With rogue_processes=kill: seconds between SIGTERM and SIGKILL of a rogue process.",
    ).tag(config=True)

    @default("gpu_backend")
    def _gpu_backend_default(self):
        return configured_backend()
