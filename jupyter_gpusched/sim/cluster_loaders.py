"""The cluster and queues a replay runs on: ``--cluster`` and ``--queues`` of ``replay`` and
``pack``.

``--cluster philly[:GPUS]`` and ``--queues philly[:GPUS]`` build a Philly-shaped cluster and the
VC queues; a ``--cluster`` ending in ``.csv`` is the Alibaba node list; anything else is a
cluster or queue YAML file. Apart from :mod:`.loaders` (the jobs of a trace) because these
describe the machines and the organisation, not the workload: they are read after the trace
(the ``philly`` queues need its virtual clusters) and with the same CSV reader.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..core import Cluster, ConfigError, QueueTree
from ..files import load_cluster, load_queues
from .loaders import Loaded, fail, number, read_rows
from .trace import TraceError

NO_GPU_NODES = "nodes without GPUs"
PHILLY_NODE_GPUS = 8
PHILLY_NODES_PER_LEAF = 16
PHILLY_LEAVES_PER_SPINE = 8
_PHILLY_NODE = {"gpus": PHILLY_NODE_GPUS, "nvlink": "none", "pcie_switches": 2}
# 8-GPU nodes owned by each virtual cluster (traces/philly/philly_vc_nodes.csv, from the Helios
# artifact); used when that file is not next to the trace. VCs missing here own nothing.
PHILLY_VC_NODES = {
    "6214e9": 64, "7f04ca": 32, "11cb48": 16, "b436b2": 64, "ee9e8c": 64, "e13805": 16,
    "6c71a0": 32, "2869ce": 16, "ed69ec": 8, "103959": 8, "0e4a51": 32,
}  # fmt: skip
PHILLY_GPUS = PHILLY_NODE_GPUS * sum(PHILLY_VC_NODES.values())  # 2,816

ALIBABA_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
_BUILTIN = re.compile(r"^philly(?::(\d+))?$")


def _builtin_gpus(spec: str, option: str, multiple: int = 1) -> int | None:
    """``philly`` -> 0 (the caller's default); ``philly:768`` -> 768; anything else -> None
    (a file name). GPUS must be a positive multiple of ``multiple``."""
    match = _BUILTIN.match(spec.strip())
    if match is None:
        return None
    gpus = int(match.group(1) or 0)
    if match.group(1) is not None and (gpus < 1 or gpus % multiple):
        need = f"a positive multiple of {multiple}" if multiple > 1 else "at least 1"
        raise ConfigError(f"{spec!r}: GPUS must be {need}", field=option)
    return gpus


def philly_cluster_data(gpus: int = PHILLY_GPUS) -> dict:
    """A Philly-shaped cluster file (as data): ``gpus / 8`` nodes of 8 GPUs (no NVLink, two PCIe
    switches: the 2017 two-socket servers), 16 nodes per leaf switch, 8 leaves per spine."""
    nodes, leaves = [], {}
    for index in range(gpus // PHILLY_NODE_GPUS):
        leaf_index = index // PHILLY_NODES_PER_LEAF
        leaf = f"leaf-{leaf_index + 1:02d}"
        spine = f"spine-{leaf_index // PHILLY_LEAVES_PER_SPINE + 1}"
        if leaf not in leaves.setdefault(spine, []):
            leaves[spine].append(leaf)
        nodes.append({"name": f"philly-n{index + 1:04d}", "leaf": leaf, **_PHILLY_NODE})
    return {"nodes": nodes, "switches": leaves}


def read_alibaba_nodes(path, skip_bad_rows: bool = False) -> Loaded:
    """The Alibaba node list (``sn, cpu_milli, memory_mib, gpu, model``) as a cluster: one node
    per row, all on one leaf switch (the trace publishes no topology, and no task asks for more
    than one node); nodes without GPUs are skipped and counted."""
    loaded, seen = Loaded(), set()

    def parse(row, line, source):
        name = row["sn"].strip()
        if not name or name in seen:
            fail(source, line, "sn", f"node name {name!r} is empty or a duplicate")
        seen.add(name)
        gpus = number(row, "gpu", source, line, whole=True)
        if gpus == 0:
            return NO_GPU_NODES
        if gpus > 64:
            fail(source, line, "gpu", f"{gpus} GPUs; a node has at most 64")
        model = row["model"].strip() or fail(source, line, "model", "is required")
        entry = {"name": name, "gpus": gpus, "gpu_model": model}
        cpus = number(row, "cpu_milli", source, line) / 1000
        memory = number(row, "memory_mib", source, line) / 1024
        if cpus:  # 0 = not given (a cluster file refuses 0)
            entry["cpus"] = cpus
        if memory:
            entry["memory_gb"] = memory
        return entry

    nodes = read_rows(path, ALIBABA_NODE_COLUMNS, parse, loaded, skip_bad_rows)
    if not nodes:
        raise TraceError("no node with GPUs in the node list", source=str(path))
    loaded.cluster = Cluster.from_dict({"nodes": nodes}, source=str(path))
    return loaded


def load_cluster_spec(spec: str, skip_bad_rows: bool = False) -> Loaded:
    """``--cluster``: ``philly[:GPUS]`` (default 2,816 GPUs), an Alibaba node-list ``.csv``, or a
    cluster YAML file."""
    gpus = _builtin_gpus(spec, "--cluster", PHILLY_NODE_GPUS)
    if gpus is not None:
        data = philly_cluster_data(gpus or PHILLY_GPUS)
        return Loaded(cluster=Cluster.from_dict(data, source=f"--cluster {spec}"))
    if Path(spec).suffix.lower() == ".csv":
        return read_alibaba_nodes(spec, skip_bad_rows)
    return Loaded(cluster=load_cluster(spec))


def read_vc_nodes(path) -> dict[str, int]:
    """``philly_vc_nodes.csv`` (``vc, node num``): the 8-GPU nodes each virtual cluster owns."""

    def parse(row, line, source):
        return row["vc"].strip(), number(row, "node num", source, line, whole=True)

    return dict(read_rows(path, ("vc", "node num"), parse, Loaded(), skip_bad_rows=False))


def philly_queues_data(queue_names, gpus: int | None = None, vc_nodes=None) -> dict:
    """A queue file (as data): one leaf queue per name, guaranteed its virtual cluster's share of
    all VCs' nodes scaled to ``gpus`` (default: the VCs' own GPUs), rounded down so the sum never
    exceeds ``gpus``; VCs that own nothing are guaranteed 0 (they only borrow). No limits."""
    vc_nodes = PHILLY_VC_NODES if vc_nodes is None else vc_nodes
    owned_total = PHILLY_NODE_GPUS * sum(vc_nodes.values())
    gpus = owned_total if gpus is None else gpus
    queues = {}
    for name in sorted({n for n in queue_names if n}):
        owned = PHILLY_NODE_GPUS * vc_nodes.get(name, 0)
        guaranteed = owned * gpus // owned_total if owned_total else 0
        queues[name] = {"guaranteed": guaranteed, "weight": 1}
    return {"queues": queues}


def load_queue_spec(spec: str, cluster: Cluster, jobs, trace_path=None) -> QueueTree:
    """``--queues``: ``philly[:GPUS]`` (queues for the VCs in ``jobs``; VC sizes from the
    ``philly_vc_nodes.csv`` next to the trace, else the built-in copy) or a queue YAML file."""
    gpus = _builtin_gpus(spec, "--queues")
    if gpus is None:
        return load_queues(spec, cluster)
    vc_file = Path(trace_path).parent / "philly_vc_nodes.csv" if trace_path else None
    vc_nodes = read_vc_nodes(vc_file) if vc_file and vc_file.is_file() else None
    data = philly_queues_data((j.queue for j in jobs), gpus or None, vc_nodes)
    return QueueTree.from_dict(data, cluster.total_gpus, source=f"--queues {spec}")
