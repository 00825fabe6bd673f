"""What telemetry tells the scheduler: the local node for ``nodes: discover``, and rogue processes.

* :func:`node_entry` builds the cluster-file entry of this machine (the dict
  :meth:`jupyter_gpusched.core.Cluster.from_dict` takes in its ``nodes`` list) from a
  :class:`~.telemetry.Telemetry`: name, GPU count, model, memory, NVLink domains (the connected
  components of the devices' NVLink peers), CPUs and memory. :func:`expand_discover` applies it to
  a parsed cluster file: ``nodes: discover``, or list entries ``{discover: true, leaf: ...}``
  whose other fields override or complete what was discovered.
* :func:`rogue_processes` lists the GPU processes that belong to no allocation: started outside
  the scheduler, or escaping their job's ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import psutil

from .telemetry import BACKEND_ENV, Device, DeviceSample, Telemetry, TelemetryUnavailable

JOB_ENV = "GPUSCHED_JOB_ID"
ROGUE_NO_JOB = "no-job"  # started outside the scheduler (or its job no longer runs here)
ROGUE_OUTSIDE_ALLOCATION = "outside-allocation"  # its job holds other GPUs


# -- nodes: discover ---------------------------------------------------------------------------


def nvlink_domains(devices: Iterable[Device]) -> list[list[int]]:
    """The NVLink domains: connected components of the peer graph, each sorted, ordered by their
    first GPU; a GPU without peers is a domain of its own. Peers outside ``devices`` are ignored."""
    devices = list(devices)
    indices = {device.index for device in devices}
    neighbours: dict[int, set[int]] = {index: set() for index in indices}
    for device in devices:
        for peer in device.nvlink_peers:
            if peer in indices and peer != device.index:
                neighbours[device.index].add(peer)
                neighbours[peer].add(device.index)  # links count both ways
    domains, seen = [], set()
    for start in sorted(indices):
        if start in seen:
            continue
        component, stack = set(), [start]
        while stack:
            index = stack.pop()
            if index in component:
                continue
            component.add(index)
            stack.extend(neighbours[index] - component)
        seen |= component
        domains.append(sorted(component))
    return domains


def nvlink_spec(devices: Iterable[Device]):
    """The cluster file's ``nvlink`` value: ``all``, ``none`` or a list of the domains of two or
    more GPUs (the others are domains of their own)."""
    devices = list(devices)
    domains = nvlink_domains(devices)
    if len(domains) == 1 and len(devices) > 1:
        return "all"
    groups = [domain for domain in domains if len(domain) > 1]
    return groups or "none"


def gpu_model_name(name: str) -> str:
    """NVML's ``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3`` (the name profiles ask for)."""
    name = name.strip()
    return name[len("NVIDIA ") :].strip() if name.startswith("NVIDIA ") else name


def node_entry(telemetry: Telemetry, *, name: str | None = None, host: bool = True) -> dict:
    """This machine's entry for the cluster file's ``nodes`` list.

    ``name``: default the telemetry's node (the short host name for NVML). ``host``: also give
    ``cpus`` and ``memory_gb`` of this machine. Raises :class:`ValueError` when the GPUs cannot
    be described by one entry (different models, or GPU indices with gaps).
    """
    devices = sorted(telemetry.devices(), key=lambda device: device.index)
    if not devices:
        raise ValueError("no GPU found on this machine")
    indices = [device.index for device in devices]
    if indices != list(range(len(devices))):
        raise ValueError(
            f"GPU indices {indices} have gaps (a GPU this process may not see?): "
            "write this node's entry by hand"
        )
    models = sorted({gpu_model_name(device.model) for device in devices})
    if len(models) > 1:
        raise ValueError(
            f"GPUs of different models on one node ({', '.join(models)}): "
            "write this node's entry by hand"
        )
    entry: dict = {
        "name": name or telemetry.node,
        "gpus": len(devices),
        "gpu_model": models[0],
    }
    memory = min(device.memory_total_gb for device in devices)
    if memory > 0:
        entry["gpu_memory_gb"] = round(memory, 1)
    entry["nvlink"] = nvlink_spec(devices)
    if host:
        entry["cpus"] = os.cpu_count() or 1
        entry["memory_gb"] = round(psutil.virtual_memory().total / (1 << 30), 1)
    return entry


def discovery_backend() -> str:
    """The backend ``nodes: discover`` uses: NVML, unless ``$GPUSCHED_GPU_BACKEND`` says
    otherwise (``simulated`` for a demo or a test; ``auto`` is NVML too)."""
    return os.environ.get(BACKEND_ENV, "").strip() or "nvml"


def needs_discovery(data) -> bool:
    """Whether a parsed cluster file asks for discovery."""
    if not isinstance(data, Mapping):
        return False
    nodes = data.get("nodes")
    if nodes == "discover":
        return True
    return isinstance(nodes, list) and any(
        isinstance(entry, Mapping) and entry.get("discover") is True for entry in nodes
    )


def expand_discover(data, telemetry: Telemetry | None = None, source: str = "cluster file"):
    """The parsed cluster file with discovery done: ``nodes: discover`` becomes the list of this
    machine's entry; an entry ``{discover: true, ...}`` becomes this machine's entry updated with
    the entry's other fields (``leaf``, ``labels``, ``pcie_switches``, ``state``, even ``name``).
    ``data`` is not changed (a copy keeps the YAML line numbers). ``telemetry``: default the
    backend of :func:`discovery_backend`. Raises :class:`~jupyter_gpusched.core.ConfigError`
    naming the file when the GPUs cannot be read."""
    from ...core.errors import ConfigError

    if not needs_discovery(data):
        return data
    try:
        if telemetry is None:
            from .backend import get_telemetry

            telemetry = get_telemetry(discovery_backend())
        discovered = node_entry(telemetry)
    except (TelemetryUnavailable, ValueError) as exc:
        raise ConfigError(
            f"'nodes: discover' cannot read this machine's GPUs: {exc}",
            source=source,
            field="nodes",
        ) from None
    result = copy.copy(data)
    if data["nodes"] == "discover":
        result["nodes"] = [discovered]
        return result
    nodes = []
    for entry in data["nodes"]:
        if isinstance(entry, Mapping) and entry.get("discover") is True:
            merged = copy.copy(entry)  # keeps the entry's line numbers for errors
            merged.clear()
            merged.update(discovered)
            merged.update({key: value for key, value in entry.items() if key != "discover"})
            nodes.append(merged)
        else:
            nodes.append(entry)
    result["nodes"] = nodes
    return result


# -- rogue processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RogueProcess:
    """A GPU process no allocation accounts for. ``reason``: :data:`ROGUE_NO_JOB` (no job, or a
    job with no allocation here) or :data:`ROGUE_OUTSIDE_ALLOCATION` (its job was given other
    GPUs: ``allowed``)."""

    pid: int
    device_index: int
    job_id: str | None
    reason: str
    utilization_percent: float | None
    memory_used_gb: float | None
    allowed: tuple[int, ...] = ()

    def describe(self) -> str:
        use = f"{self.utilization_percent:.0f}%" if self.utilization_percent is not None else "?%"
        if self.memory_used_gb is not None:
            use += f", {self.memory_used_gb:.1f} GB"
        if self.reason == ROGUE_OUTSIDE_ALLOCATION:
            why = f"job {self.job_id} was given GPUs {list(self.allowed)}"
        elif self.job_id is not None:
            why = f"job {self.job_id} holds no GPU here"
        else:
            why = "it belongs to no job of the scheduler"
        return f"process {self.pid} uses GPU {self.device_index} ({use}) but {why}"


def rogue_processes(
    samples: Iterable[DeviceSample],
    allocations: Mapping[str, Iterable[int]],
    pid_to_job: Callable[[int], str | None],
) -> list[RogueProcess]:
    """GPU processes that belong to no allocation, ordered by GPU and PID.

    ``allocations``: job id -> the GPU indices (of this node) it holds. ``pid_to_job``: the job a
    process belongs to, or None (e.g. :func:`job_of_process`); a lookup raising
    :class:`psutil.Error` (the process is gone, or may not be inspected) skips the process:
    unknown is not rogue.
    """
    allowed = {job: frozenset(gpus) for job, gpus in allocations.items()}
    jobs: dict[int, str | None] = {}
    found: list[RogueProcess] = []
    for sample in samples:
        for process in sample.processes:
            if process.pid not in jobs:
                try:
                    job = pid_to_job(process.pid)
                except psutil.Error:
                    continue
                jobs[process.pid] = None if job is None else str(job)
            job = jobs[process.pid]
            if job is not None and job in allowed:
                if process.device_index in allowed[job]:
                    continue
                reason, gpus = ROGUE_OUTSIDE_ALLOCATION, tuple(sorted(allowed[job]))
            else:
                reason, gpus = ROGUE_NO_JOB, ()
            found.append(
                RogueProcess(
                    pid=process.pid,
                    device_index=process.device_index,
                    job_id=job,
                    reason=reason,
                    utilization_percent=process.utilization_percent,
                    memory_used_gb=process.memory_used_gb,
                    allowed=gpus,
                )
            )
    return sorted(found, key=lambda rogue: (rogue.device_index, rogue.pid))


def job_of_process(pid: int, variable: str = JOB_ENV) -> str | None:
    """The job of a process: ``$GPUSCHED_JOB_ID`` in its environment or its nearest ancestor's
    (the spawner and the launcher set it; kernels and job children inherit it), else None.

    The environment of another user's process is readable only by root (else
    :class:`psutil.AccessDenied`, which :func:`rogue_processes` treats as unknown), and a user can
    set the variable in their own processes: this finds the honest and the careless, not the
    malicious; a process claiming a job on GPUs outside that job's allocation is still reported.
    """
    process: psutil.Process | None = psutil.Process(pid)
    while process is not None and process.pid > 1:
        value = process.environ().get(variable)
        if value:
            return value
        process = process.parent()
    return None
