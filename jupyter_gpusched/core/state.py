"""Which GPUs are free right now, indexed so that placement does not scan the whole cluster.

``index[model][c][leaf]`` is the set of schedulable (``up``) nodes of that GPU model under that
leaf with exactly ``c`` free GPUs. Drained and down nodes are in no bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cluster import Cluster


@dataclass(frozen=True)
class Part:
    """The share of one node that a job holds: a GPU mask, and CPUs / memory (GB)."""

    node: int
    mask: int
    cpus: float = 0.0
    memory_gb: float = 0.0

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
        self.allocations: dict[str, Placement] = {}
        self.holders: list[set[str]] = [set() for _ in nodes]  # who holds GPUs on each node
        for node in nodes:
            if node.state == "up":
                self._add(node.index)

    # -- the index ---------------------------------------------------------------------------
    def _add(self, idx: int) -> None:
        node = self.cluster.nodes[idx]
        free = self.free[idx]
        self.index[node.gpu_model][free].setdefault(node.leaf, set()).add(idx)
        self.leaf_free[node.leaf] += free
        self.model_free[node.gpu_model] += free
        self.free_total += free

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

    def schedulable(self, idx: int) -> bool:
        return self.node_state[idx] == "up"

    # -- allocation ---------------------------------------------------------------------------
    def take(self, job_id: str, placement: Placement, extend: bool = False) -> None:
        """Give ``placement`` to ``job_id``; every GPU in it must be free (invariant 1).
        With ``extend``, add it to what ``job_id`` already holds."""
        held = self.allocations.pop(job_id, None) if extend else None
        if job_id in self.allocations:
            raise RuntimeError(f"job {job_id} already holds GPUs")
        for part in placement.parts:
            idx = part.node
            if part.mask & ~self.free_mask[idx]:
                raise RuntimeError(f"job {job_id}: GPUs {part.mask:b} on node {idx} are not free")
            up = self.schedulable(idx)
            if up:
                self._remove(idx)
            self.free_mask[idx] &= ~part.mask
            self.free[idx] = self.free_mask[idx].bit_count()
            self.cpu_free[idx] -= part.cpus
            self.mem_free[idx] -= part.memory_gb
            if up:
                self._add(idx)
            self.holders[idx].add(job_id)
        if held is not None:
            placement = Placement(held.parts + placement.parts)
        self.allocations[job_id] = placement

    def release(self, job_id: str) -> Placement:
        placement = self.allocations.pop(job_id)
        for part in placement.parts:
            idx = part.node
            up = self.schedulable(idx)
            if up:
                self._remove(idx)
            self.free_mask[idx] |= part.mask
            self.free[idx] = self.free_mask[idx].bit_count()
            self.cpu_free[idx] += part.cpus
            self.mem_free[idx] += part.memory_gb
            if up:
                self._add(idx)
            self.holders[idx].discard(job_id)
        return placement

    def set_node_state(self, idx: int, state: str) -> None:
        was_up = self.schedulable(idx)
        if was_up:
            self._remove(idx)
        self.node_state[idx] = state
        if state == "up":
            self._add(idx)
