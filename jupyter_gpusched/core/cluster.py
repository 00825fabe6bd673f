"""The cluster model: nodes, GPUs, NVLink domains, PCIe switches, leaf and spine switches.

Built from the cluster file of DESIGN.md (already parsed into Python data; reading the file is the
adapter's job, see :mod:`jupyter_gpusched.files`). The model is static: which GPUs are free lives
in :class:`jupyter_gpusched.core.state.ClusterState`.

Within a node, GPUs are numbered 0..gpus-1 and handled as bit masks: bit i set = GPU i.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError, line_of
from .hostlist import expand_hostlist

NODE_STATES = ("up", "drain", "down")
DEFAULT_LEAF = "leaf"
DEFAULT_SPINE = "spine"
_NODE_FIELDS = {
    "name",
    "gpus",
    "gpu_model",
    "gpu_memory_gb",
    "nvlink",
    "pcie_switches",
    "leaf",
    "labels",
    "cpus",
    "memory_gb",
    "state",
}


@dataclass(eq=False)
class Node:
    """One machine. ``domains`` are NVLink domains and ``pcie_groups`` PCIe switch groups, each a
    bit mask of local GPU indices."""

    index: int
    name: str
    gpus: int
    gpu_model: str
    gpu_memory_gb: float | None
    domains: tuple[int, ...]
    pcie_groups: tuple[int, ...]
    leaf: str
    spine: str
    labels: dict[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_gb: float | None = None
    state: str = "up"

    @property
    def all_mask(self) -> int:
        return (1 << self.gpus) - 1


class Cluster:
    """Nodes in file order, with their leaf and spine switches."""

    def __init__(self, nodes: list[Node]):
        if not nodes:
            raise ConfigError("the cluster has no nodes", field="nodes")
        self.nodes = nodes
        self.by_name = {node.name: node for node in nodes}
        self.leaves: dict[str, list[int]] = {}
        self.spines: dict[str, list[str]] = {}
        for node in nodes:
            self.leaves.setdefault(node.leaf, []).append(node.index)
            leaves_of_spine = self.spines.setdefault(node.spine, [])
            if node.leaf not in leaves_of_spine:
                leaves_of_spine.append(node.leaf)
        self.spine_of_leaf = {node.leaf: node.spine for node in nodes}
        self.leaf_of = [node.leaf for node in nodes]  # by node index (for hot loops)
        self.total_gpus = sum(node.gpus for node in nodes)
        self.max_node_gpus = max(node.gpus for node in nodes)
        self.gpu_models = sorted({node.gpu_model for node in nodes})

    def node(self, name: str) -> Node:
        try:
            return self.by_name[name]
        except KeyError:
            raise ConfigError(f"no node named {name!r} in the cluster", field="node") from None

    @classmethod
    def from_dict(cls, data, source: str = "cluster file") -> Cluster:
        """Build a cluster from the parsed cluster file; errors name the file, entry and field."""
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping with a 'nodes' list", source=source)
        unknown = set(data) - {"nodes", "switches"}  # ('node:' for 'nodes:' is named first)
        if unknown:
            key = sorted(unknown)[0]
            raise ConfigError(
                f"unknown key {key!r} (expected 'nodes' and 'switches')",
                source=source,
                field=key,
                line=line_of(data, key),
            )
        if "nodes" not in data:
            raise ConfigError("expected a mapping with a 'nodes' list", source=source)
        entries = data["nodes"]
        if entries == "discover":
            raise ConfigError(
                "'nodes: discover' needs the NVML GPU backend; pass the discovered nodes instead",
                source=source,
                field="nodes",
            )
        if not isinstance(entries, list) or not entries:
            raise ConfigError("'nodes' must be a non-empty list", source=source, field="nodes")
        spine_of_leaf = _parse_switches(data.get("switches"), source, line_of(data, "switches"))
        nodes: list[Node] = []
        seen: dict[str, str] = {}
        for position, entry in enumerate(entries):
            for node in _parse_node_entry(entry, position, source, spine_of_leaf, len(nodes)):
                if node.name in seen:
                    raise ConfigError(
                        f"duplicate node name {node.name!r} (also in {seen[node.name]})",
                        source=source,
                        entry=f"nodes[{position}]",
                        field="name",
                        line=line_of(entry, "name"),
                    )
                seen[node.name] = f"nodes[{position}]"
                nodes.append(node)
        return cls(nodes)


def _parse_switches(switches, source, line) -> dict[str, str] | None:
    if switches is None:
        return None
    if not isinstance(switches, dict):
        raise ConfigError(
            "'switches' must map spine names to lists of leaf names",
            source=source,
            field="switches",
            line=line,
        )
    spine_of_leaf: dict[str, str] = {}
    for spine, leaves in switches.items():
        if not isinstance(leaves, list) or not all(isinstance(x, str) for x in leaves):
            raise ConfigError(
                "must be a list of leaf switch names",
                source=source,
                entry=f"switches.{spine}",
                field=str(spine),
                line=line_of(switches, spine),
            )
        for leaf in leaves:
            if leaf in spine_of_leaf:
                raise ConfigError(
                    f"leaf {leaf!r} is under two spines ({spine_of_leaf[leaf]} and {spine})",
                    source=source,
                    entry=f"switches.{spine}",
                    field=str(spine),
                    line=line_of(switches, spine),
                )
            spine_of_leaf[leaf] = str(spine)
    return spine_of_leaf


def _parse_node_entry(entry, position, source, spine_of_leaf, first_index) -> list[Node]:
    where = f"nodes[{position}]"

    def fail(message, key):
        raise ConfigError(message, source=source, entry=where, field=key, line=line_of(entry, key))

    if not isinstance(entry, dict):
        raise ConfigError("each node entry must be a mapping", source=source, entry=where)
    for key in entry:
        if key not in _NODE_FIELDS:
            fail(f"unknown field {key!r}; known fields: {', '.join(sorted(_NODE_FIELDS))}", key)
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        fail("every node needs a 'name' (a host name or a range like gpu-a[01-04])", "name")
    where = f"{where} ({name})"
    try:
        names = expand_hostlist(name)
    except ValueError as exc:
        fail(str(exc), "name")
    gpus = entry.get("gpus")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        fail(f"'gpus' must be a whole number >= 1, got {gpus!r}", "gpus")
    if gpus > 64:
        fail(f"'gpus' is {gpus}; a node has at most 64 GPUs", "gpus")
    model = str(entry.get("gpu_model", "gpu"))
    memory = _optional_number(entry, "gpu_memory_gb", fail)
    domains = _parse_nvlink(entry.get("nvlink", "all"), gpus, lambda m: fail(m, "nvlink"))
    switches = entry.get("pcie_switches", 1)
    if isinstance(switches, bool) or not isinstance(switches, int) or switches < 1:
        fail(f"'pcie_switches' must be a whole number >= 1, got {switches!r}", "pcie_switches")
    if gpus % switches:
        fail(f"{gpus} GPUs cannot be split evenly over {switches} PCIe switches", "pcie_switches")
    per_switch = gpus // switches
    pcie = tuple(((1 << per_switch) - 1) << (i * per_switch) for i in range(switches))
    leaf = entry.get("leaf", DEFAULT_LEAF)
    if not isinstance(leaf, str) or not leaf:
        fail("'leaf' must be a switch name", "leaf")
    if spine_of_leaf is None:
        spine = DEFAULT_SPINE
    elif leaf in spine_of_leaf:
        spine = spine_of_leaf[leaf]
    else:
        known = ", ".join(sorted(spine_of_leaf)) or "none"
        fail(f"unknown leaf {leaf!r}: it is under no spine in 'switches' (known: {known})", "leaf")
    labels = entry.get("labels") or {}
    if not isinstance(labels, dict):
        fail("'labels' must be a mapping of names to values", "labels")
    labels = {str(k): str(v) for k, v in labels.items()}
    cpus = _optional_number(entry, "cpus", fail)
    memory_gb = _optional_number(entry, "memory_gb", fail)
    state = entry.get("state", "up")
    if state not in NODE_STATES:
        fail(f"'state' must be one of {', '.join(NODE_STATES)}, got {state!r}", "state")
    return [
        Node(
            index=first_index + i,
            name=node_name,
            gpus=gpus,
            gpu_model=model,
            gpu_memory_gb=memory,
            domains=domains,
            pcie_groups=pcie,
            leaf=leaf,
            spine=spine,
            labels=dict(labels),
            cpus=cpus,
            memory_gb=memory_gb,
            state=state,
        )
        for i, node_name in enumerate(names)
    ]


def _optional_number(entry, key, fail):
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        fail(f"'{key}' must be a positive number, got {value!r}", key)
    return float(value)


def _parse_nvlink(spec, gpus: int, fail) -> tuple[int, ...]:
    """NVLink domains as bit masks; GPUs in no listed domain form a domain of their own."""
    if spec == "all" or spec is True:
        return ((1 << gpus) - 1,)
    if spec == "none" or spec is False or spec is None:
        groups = [[i] for i in range(gpus)]
    elif spec == "pairs":
        groups = [list(range(i, min(i + 2, gpus))) for i in range(0, gpus, 2)]
    elif isinstance(spec, list) and all(isinstance(g, list) for g in spec):
        groups = spec
    else:
        fail(f"must be all, none, pairs or a list of GPU index lists, got {spec!r}")
    masks, used = [], 0
    for group in groups:
        mask = 0
        for gpu in group:
            if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < gpus:
                fail(f"GPU index {gpu!r} is not between 0 and {gpus - 1}")
            if used & (1 << gpu):
                fail(f"GPU {gpu} is in two NVLink domains")
            mask |= 1 << gpu
            used |= 1 << gpu
        if mask:
            masks.append(mask)
    masks.extend(1 << i for i in range(gpus) if not used & (1 << i))
    return tuple(sorted(masks, key=lambda m: m & -m))
