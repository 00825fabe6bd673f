"""Which GPUs are free right now, indexed so that placement does not scan the whole cluster.

``index[model][c][leaf]`` is the set of schedulable (``up``) nodes of that GPU model under that
leaf with exactly ``c`` free GPUs. Drained and down nodes are in no bucket.

A GPU that fractional jobs share is *shared*: it is not free (no whole-GPU job lands on it),
``shared[node][gpu bit]`` is the fraction in use, and ``shared_index[model]`` lists the room
left on each shared GPU of schedulable nodes, ascending, for best-fit placement.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass

from .cluster import Cluster
from .copying import copy_parts


@dataclass(frozen=True)
class Part:
    """The share of one node that a job holds: a GPU mask, and CPUs / memory (GB)."""

    node: int
    mask: int
    cpus: float = 0.0
    memory_gb: float = 0.0
    fraction: float = 1.0  # below 1: a share of the one GPU in ``mask``

    @property
    def gpus(self) -> int:
        return self.mask.bit_count()


@dataclass(frozen=True)
class Placement:
    parts: tuple[Part, ...]

    @property
    def gpus(self) -> int:
        return sum(part.gpus for part in self.parts)

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(part.node for part in self.parts)


class ClusterState:
    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        nodes = cluster.nodes
        self.free_mask = [n.all_mask for n in nodes]
        self.free = [n.gpus for n in nodes]
        self.cpu_free = [math.inf if n.cpus is None else n.cpus for n in nodes]
        self.mem_free = [math.inf if n.memory_gb is None else n.memory_gb for n in nodes]
        self.node_state = [n.state for n in nodes]
        self.index: dict[str, list[dict[str, set[int]]]] = {
            model: [{} for _ in range(cluster.max_node_gpus + 1)] for model in cluster.gpu_models
        }
        self.leaf_free = dict.fromkeys(cluster.leaves, 0)
        self.model_free = dict.fromkeys(cluster.gpu_models, 0)
        self.free_total = 0
        self.nodes_by_free = [0] * (cluster.max_node_gpus + 1)  # up nodes with c GPUs free
        self.leaf_nodes_by_free = {  # the same per leaf
            leaf: [0] * (cluster.max_node_gpus + 1) for leaf in cluster.leaves
        }
        self.allocations: dict[str, Placement] = {}
        self.holders: list[set[str]] = [set() for _ in nodes]  # who holds GPUs on each node
        self.shared: list[dict[int, float]] = [{} for _ in nodes]  # node -> {GPU bit: used}
        self.shared_index: dict[str, list[tuple[float, int, int]]] = {
            model: [] for model in cluster.gpu_models
        }
        self.shared_room = dict.fromkeys(cluster.gpu_models, 0.0)
        self.shared_room_total = 0.0
        self.fgd = None  # a fragmentation model (core.fragmentation), for FGD placement
        self.touched: set[int] = set(range(len(nodes)))  # nodes changed since fgd last looked
        self.version = 0  # counts the changes to nodes' free GPUs and states (caches read it)
        for node in nodes:
            if node.state == "up":
                self._add(node.index)

    # -- the index ---------------------------------------------------------------------------
    def __deepcopy__(self, memo):  # (core/copying.py: numbers, states, frozen placements)
        flat = ("free_mask", "free", "cpu_free", "mem_free", "node_state", "allocations")
        return copy_parts(self, memo, flat=flat)

    def _add(self, idx: int) -> None:
        node = self.cluster.nodes[idx]
        free = self.free[idx]
        self.index[node.gpu_model][free].setdefault(node.leaf, set()).add(idx)
        self.leaf_free[node.leaf] += free
        self.model_free[node.gpu_model] += free
        self.free_total += free
        self.nodes_by_free[free] += 1
        self.leaf_nodes_by_free[node.leaf][free] += 1

    def _remove(self, idx: int) -> None:
        node = self.cluster.nodes[idx]
        free = self.free[idx]
        bucket = self.index[node.gpu_model][free]
        members = bucket[node.leaf]
        members.discard(idx)
        if not members:
            del bucket[node.leaf]
        self.leaf_free[node.leaf] -= free
        self.model_free[node.gpu_model] -= free
        self.free_total -= free
        self.nodes_by_free[free] -= 1
        self.leaf_nodes_by_free[node.leaf][free] -= 1

    def schedulable(self, idx: int) -> bool:
        return self.node_state[idx] == "up"

    # -- allocation ---------------------------------------------------------------------------
    def conflict(self, placement: Placement) -> str | None:
        """Why ``placement`` cannot be taken now (unknown node, GPUs taken, a shared GPU too
        full, CPUs or memory short), or None."""
        seen: dict[int, int] = {}
        for part in placement.parts:
            if not 0 <= part.node < len(self.cluster.nodes):
                return f"node index {part.node} is not in the cluster"
            if seen.get(part.node, 0) & part.mask:
                return f"two parts of the placement use GPU {part.mask:b} on node {part.node}"
            seen[part.node] = seen.get(part.node, 0) | part.mask
            node = self.cluster.nodes[part.node]
            if part.mask >> node.gpus:
                return f"node {node.name} has no GPU {part.mask.bit_length() - 1}"
            if part.fraction < 1.0 and part.mask in self.shared[part.node]:
                if self.shared[part.node][part.mask] + part.fraction > 1.0 + 1e-9:
                    return f"GPU {part.mask.bit_length() - 1} on {node.name} is full"
            elif part.mask & ~self.free_mask[part.node]:
                return f"GPUs {part.mask:b} on {node.name} are not free"
            if part.cpus > self.cpu_free[part.node] + 1e-9:
                return f"node {node.name} has {self.cpu_free[part.node]:g} CPUs free"
            if part.memory_gb > self.mem_free[part.node] + 1e-9:
                return f"node {node.name} has {self.mem_free[part.node]:g} GB free"
        return None

    def take(self, job_id: str, placement: Placement, extend: bool = False) -> None:
        """Give ``placement`` to ``job_id``; every GPU in it must be free, or for a fraction,
        shared with room enough (invariant 1). With ``extend``, add it to what ``job_id``
        already holds."""
        held = self.allocations.pop(job_id, None) if extend else None
        if job_id in self.allocations:
            raise RuntimeError(f"job {job_id} already holds GPUs")
        for part in placement.parts:
            idx = part.node
            if part.fraction < 1.0:
                used = self.shared[idx].get(part.mask)
                if used is not None:
                    self._unindex_shared(idx, part.mask, used)
                elif part.mask & ~self.free_mask[idx]:
                    raise RuntimeError(f"job {job_id}: GPU {part.mask:b} on node {idx} is taken")
                used = (used or 0.0) + part.fraction
                if used > 1.0 + 1e-9:
                    raise RuntimeError(f"job {job_id}: GPU {part.mask:b} on node {idx} is full")
                self.shared[idx][part.mask] = used
                self._index_shared(idx, part.mask, used)
            elif part.mask & ~self.free_mask[idx]:
                raise RuntimeError(f"job {job_id}: GPUs {part.mask:b} on node {idx} are not free")
            self._change(idx, ~part.mask, -part.cpus, -part.memory_gb)
            self.holders[idx].add(job_id)
        if held is not None:
            placement = Placement(held.parts + placement.parts)
        self.allocations[job_id] = placement

    def release(self, job_id: str) -> Placement:
        placement = self.allocations.pop(job_id)
        for part in placement.parts:
            idx = part.node
            gpus = part.mask
            if part.fraction < 1.0:
                used = self.shared[idx][part.mask]
                self._unindex_shared(idx, part.mask, used)
                used -= part.fraction
                if used > 1e-9:
                    self.shared[idx][part.mask] = used
                    self._index_shared(idx, part.mask, used)
                    gpus = 0  # others still share it
                else:
                    del self.shared[idx][part.mask]
            self._change(idx, gpus, part.cpus, part.memory_gb, give=True)
            self.holders[idx].discard(job_id)
        return placement

    def _change(self, idx: int, mask: int, cpus: float, memory: float, give: bool = False):
        self.touched.add(idx)
        self.version += 1
        up = self.schedulable(idx)
        if up:
            self._remove(idx)
        if give:
            self.free_mask[idx] |= mask
        else:
            self.free_mask[idx] &= mask
        self.free[idx] = self.free_mask[idx].bit_count()
        self.cpu_free[idx] += cpus
        self.mem_free[idx] += memory
        if up:
            self._add(idx)

    def _index_shared(self, idx: int, bit: int, used: float) -> None:
        room = 1.0 - used
        if room > 1e-9 and self.schedulable(idx):
            model = self.cluster.nodes[idx].gpu_model
            insort(self.shared_index[model], (room, idx, bit))
            self.shared_room[model] += room
            self.shared_room_total += room

    def _unindex_shared(self, idx: int, bit: int, used: float) -> None:
        room = 1.0 - used
        if room > 1e-9 and self.schedulable(idx):
            model = self.cluster.nodes[idx].gpu_model
            entries = self.shared_index[model]
            del entries[bisect_left(entries, (room, idx, bit))]
            self.shared_room[model] -= room
            self.shared_room_total -= room

    def free_for(self, job) -> float:
        """Free GPUs of the models ``job`` accepts (for a fractional job, with the room left on
        shared GPUs)."""
        if job.gpu_models is None:
            return self.free_total + (self.shared_room_total if job.fractional else 0.0)
        free = sum(f for model, f in self.model_free.items() if model in job.gpu_models)
        if job.fractional:
            free += sum(r for model, r in self.shared_room.items() if model in job.gpu_models)
        return free

    def set_node_state(self, idx: int, state: str) -> None:
        self.touched.add(idx)
        self.version += 1
        on_node = list(self.shared[idx].items())
        if self.schedulable(idx):
            self._remove(idx)
            for bit, used in on_node:
                self._unindex_shared(idx, bit, used)
        self.node_state[idx] = state
        if state == "up":
            self._add(idx)
            for bit, used in on_node:
                self._index_shared(idx, bit, used)
