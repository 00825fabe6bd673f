"""The simulated backend: GPUs that exist only in the cluster file, loaded by any process.

The GPUs of a node are those of the cluster file (or of ``$GPUSCHED_SIM_GPUS`` and its
neighbours); processes put load on them with :func:`~.simulated_loads.simulate_load`, which
writes a load file (:mod:`.simulated_loads` holds the files, who may write them, and where).
:meth:`SimulatedTelemetry.sample` reads the files and reports each device and each process as NVML
would: the process's real PID, its utilization and memory on each GPU it loads, the device's
utilization (the sum, at most 100%: processes sharing a GPU over 100% are scaled down to their
time-slice share) and memory. ``sample()`` deletes the files of loads that ended (their
``seconds`` passed or their process exited).

Several simulated nodes can share one machine (the demo runs every node of the cluster file on one
host): each load belongs to a node (``$GPUSCHED_NODE``, which the spawner sets, else the host
name), and a backend reports only its own node's loads.

The load side's public names are imported here too: this module (and its old name
``jupyter_gpusched.gpu.simulated``) is where users and the docs have always found
``simulate_load`` and ``make_load_dir``.

Not for production: any process can load GPUs outside its allocation, or make up its own load.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

from .simulated_loads import (
    CREATE_TIME_TOLERANCE,
    NODE_ENV,
    STATE_DIR_ENV,
    SimulatedLoad,
    default_node,
    default_state_dir,
    make_load_dir,
    may_load,
    process_identity,
    read_records,
    resolve_state_dir,
    simulate_load,
    simulated_bus_id,
    simulated_uuid,
    stop_load,
    visible_gpus,
)
from .telemetry import Device, DeviceSample, GPUProcess, Telemetry

__all__ = [
    "STATE_DIR_ENV",
    "SimulatedLoad",
    "SimulatedTelemetry",
    "default_state_dir",
    "make_load_dir",
    "simulate_load",
    "simulated_uuid",
    "stop_load",
    "visible_gpus",
]

CLUSTER_ENV = "GPUSCHED_SIM_CLUSTER"  # a cluster file: the node's GPUs, model, memory, NVLink
GPUS_ENV = "GPUSCHED_SIM_GPUS"  # without a cluster file: how many GPUs (default 8)
MODEL_ENV = "GPUSCHED_SIM_GPU_MODEL"  # default "Simulated-GPU"
MEMORY_ENV = "GPUSCHED_SIM_GPU_MEMORY_GB"  # default 80
DEFAULT_GPUS = 8
DEFAULT_MODEL = "Simulated-GPU"
DEFAULT_MEMORY_GB = 80.0


class SimulatedTelemetry(Telemetry):
    """The GPUs of one simulated node and the loads put on them.

    The node: ``node`` (default ``$GPUSCHED_NODE``, else the host name) looked up in ``cluster``
    (a cluster file's path, its parsed dict, or a :class:`~jupyter_gpusched.core.Cluster`;
    default ``$GPUSCHED_SIM_CLUSTER``); without a cluster, ``gpus`` GPUs of ``model`` with
    ``memory_gb`` each and ``nvlink`` domains as in the cluster file (defaults from
    ``$GPUSCHED_SIM_GPUS``, ``$GPUSCHED_SIM_GPU_MODEL``, ``$GPUSCHED_SIM_GPU_MEMORY_GB``, else 8
    GPUs, ``Simulated-GPU``, 80 GB, NVLink ``all``). ``state_dir``: see :func:`resolve_state_dir`.
    """

    backend = "simulated"

    def __init__(
        self,
        *,
        node: str | None = None,
        cluster=None,
        gpus: int | None = None,
        model: str | None = None,
        memory_gb: float | None = None,
        nvlink="all",
        state_dir=None,
    ):
        self.node = node or default_node()
        self.state_dir = resolve_state_dir(state_dir)
        if cluster is None:
            cluster = os.environ.get(CLUSTER_ENV) or None
        if cluster is not None:
            spec = _node_from_cluster(cluster, self.node)
        else:
            spec = _node_from_options(self.node, gpus, model, memory_gb, nvlink)
        memory = spec.gpu_memory_gb or DEFAULT_MEMORY_GB
        self._devices = []
        for index in range(spec.gpus):
            domain = next((mask for mask in spec.domains if mask >> index & 1), 1 << index)
            peers = tuple(i for i in range(spec.gpus) if domain >> i & 1 and i != index)
            self._devices.append(
                Device(
                    index=index,
                    uuid=simulated_uuid(self.node, index),
                    model=spec.gpu_model,
                    memory_total_gb=float(memory),
                    nvlink_peers=peers,
                    pci_bus_id=simulated_bus_id(index),
                )
            )

    def devices(self) -> list[Device]:
        return list(self._devices)

    def sample(self) -> list[DeviceSample]:
        now = time.time()
        alive: dict[int, float | None] = {}
        loads: dict[int, list[dict]] = {device.index: [] for device in self._devices}
        for path, record, owner in read_records(self.state_dir):
            if record.get("node") != self.node:
                continue
            try:
                pid = int(record["pid"])
                device = int(record["device"])
                until = record.get("until")
                created = float(record["create_time"])
            except (KeyError, TypeError, ValueError):
                continue
            if pid not in alive:
                try:
                    alive[pid] = process_identity(pid)
                except psutil.Error:
                    alive[pid] = None
            gone = alive[pid] is None or abs(alive[pid] - created) > CREATE_TIME_TOLERANCE
            if gone or (until is not None and float(until) <= now):
                with contextlib.suppress(OSError):  # another user's file: leave it
                    path.unlink()
                continue
            if not may_load(owner, pid):
                continue  # a load faked for another user's process
            if device in loads:
                loads[device].append(record)
        return [self._device_sample(device, loads[device.index]) for device in self._devices]

    def _device_sample(self, device: Device, records: list[dict]) -> DeviceSample:
        total_util = sum((float(r.get("utilization_percent", 0)) for r in records), 0.0)
        scale = 100.0 / total_util if total_util > 100 else 1.0
        per_pid: dict[int, list[float]] = {}
        for record in records:  # one record per (process, GPU); merge defensively
            util = float(record.get("utilization_percent", 0)) * scale
            memory = float(record.get("memory_gb", 0))
            entry = per_pid.setdefault(int(record["pid"]), [0.0, 0.0])
            entry[0] = min(100.0, entry[0] + util)
            entry[1] += memory
        processes = [
            GPUProcess(pid, device.index, util, memory)
            for pid, (util, memory) in sorted(per_pid.items())
        ]
        return DeviceSample(
            device=device,
            utilization_percent=min(100.0, total_util),
            memory_used_gb=min(
                device.memory_total_gb, sum((p.memory_used_gb for p in processes), 0.0)
            ),
            processes=processes,
            backend=self.backend,
        )


def _node_from_cluster(cluster, name: str):
    from ...core import Cluster

    if not isinstance(cluster, Cluster):
        if isinstance(cluster, dict):
            cluster = Cluster.from_dict(cluster)
        else:
            # A plain cluster file: 'nodes: discover' or 'nodes: slurm' make no sense for the
            # simulated GPUs (discovery would ask them for themselves), and reading those needs
            # jupyter_gpusched.files, which imports the backends.
            from ...yaml_lines import read_yaml

            cluster = Cluster.from_dict(read_yaml(cluster), source=str(cluster))
    if name not in cluster.by_name:
        known = ", ".join(node.name for node in cluster.nodes[:10])
        more = ", ..." if len(cluster.nodes) > 10 else ""
        raise ValueError(
            f"simulated GPUs: no node named {name!r} in the cluster file (nodes: {known}{more}); "
            f"set {NODE_ENV} or pass node="
        )
    return cluster.by_name[name]


def _node_from_options(name, gpus, model, memory_gb, nvlink):
    from ...core import Cluster

    if gpus is None:
        gpus = int(os.environ.get(GPUS_ENV) or DEFAULT_GPUS)
    if model is None:
        model = os.environ.get(MODEL_ENV) or DEFAULT_MODEL
    if memory_gb is None:
        memory_gb = float(os.environ.get(MEMORY_ENV) or DEFAULT_MEMORY_GB)
    entry = {"name": name, "gpus": gpus, "gpu_model": model, "gpu_memory_gb": memory_gb}
    entry["nvlink"] = nvlink
    return Cluster.from_dict({"nodes": [entry]}, source="simulated GPUs").nodes[0]
