"""Reservation for the highest-priority blocked job, and the EASY backfill test.

The blocked job's *shadow time* is the earliest time it would fit if running jobs end at their
walltime estimates (a job past its estimate is taken to end now). Its *reserved nodes* are the
nodes it would use then. A lower-priority job may start now only if it ends before the shadow
time, or if it keeps off the reserved nodes: either way the reservation is not delayed.

GPUs that a pre-empting job has claimed, and the GPUs of its victims, are not counted: they are
already promised. Topology is ignored (counts per node only), except for a gang that fits one
leaf switch under a topology-aware policy: it reserves one leaf's nodes when one leaf frees soon
enough after the GPUs it needs free anywhere (see :func:`reserve`), so that when its reservation
comes due it starts inside one leaf rather than wherever GPUs freed first.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobs import Job
from .state import ClusterState


@dataclass(frozen=True)
class Reservation:
    job_id: str
    start: float | None  # shadow time; None when the job cannot fit even once all running end
    nodes: frozenset[int]


class _Pool:
    """The GPUs free, at the time being considered, on some of the nodes a job may use."""

    def __init__(self, job: Job, single: bool, threshold: int) -> None:
        self.job, self.single, self.threshold = job, single, threshold
        self.avail: dict[int, int] = {}  # node -> GPUs free then
        self.ready: set[int] = set()  # nodes with at least ``threshold`` GPUs free then
        self.total = 0

    def add(self, idx: int, gpus: int) -> None:
        self.avail[idx] = self.avail.get(idx, 0) + gpus
        self.total += gpus
        if self.avail[idx] >= self.threshold:
            self.ready.add(idx)

    def fits(self) -> bool:
        """As ``chosen() is not None``, without choosing."""
        if self.single:
            return bool(self.ready)
        if self.job.gpus_per_node:
            return len(self.ready) >= self.job.gpus // self.job.gpus_per_node
        return self.total >= self.job.gpus

    def chosen(self) -> frozenset[int] | None:
        """The nodes the job would use, or None if it does not fit yet."""
        job, avail, ready = self.job, self.avail, self.ready
        if self.single:
            return frozenset((min(ready, key=lambda i: (avail[i], i)),)) if ready else None
        if job.gpus_per_node:
            count = job.gpus // job.gpus_per_node
            return frozenset(sorted(ready)[:count]) if len(ready) >= count else None
        if self.total < job.gpus:
            return None
        nodes, need = [], job.gpus
        for idx in sorted(avail, key=lambda i: (-avail[i], i)):
            nodes.append(idx)
            need -= avail[idx]
            if need <= 0:
                break
        return frozenset(nodes)


def reserve(
    state: ClusterState, job: Job, ends, jobs: dict, now: float, one_leaf_within=None
) -> Reservation:
    """``ends`` is the running jobs' (estimated end, job id) in ascending order.

    ``one_leaf_within`` (seconds; None: topology ignored) is for a gang that fits one leaf
    switch: its reservation is the earliest time one leaf has room for it, on that leaf's nodes,
    unless that comes more than ``one_leaf_within`` after the time it would fit across leaves
    (then it is the cross-leaf one, as without topology)."""
    cluster = state.cluster

    def eligible(idx: int) -> bool:
        node = cluster.nodes[idx]
        return (
            state.node_state[idx] == "up"
            and (job.gpu_models is None or node.gpu_model in job.gpu_models)
            and all(node.labels.get(k) == v for k, v in job.labels.items())
        )

    single = (job.gpus_per_node or job.gpus) == job.gpus and job.gpus <= cluster.max_node_gpus
    threshold = job.gpus if single else (job.gpus_per_node or 1)
    pool = _Pool(job, single, threshold)
    leaves: dict[str, _Pool] | None = {} if one_leaf_within is not None else None

    def add(idx: int, gpus: int) -> None:
        pool.add(idx, gpus)
        if leaves is not None:
            leaf = cluster.nodes[idx].leaf
            if leaf not in leaves:
                leaves[leaf] = _Pool(job, single, threshold)
            leaves[leaf].add(idx, gpus)

    node_state, labels = state.node_state, tuple(job.labels.items())
    for model, buckets in state.index.items():  # (the index holds the nodes with free GPUs)
        if job.gpu_models is not None and model not in job.gpu_models:
            continue
        for count in range(1, len(buckets)):
            for members in buckets[count].values():
                for idx in members:
                    if node_state[idx] != "up":
                        continue
                    if labels and not all(cluster.nodes[idx].labels.get(k) == v for k, v in labels):
                        continue
                    add(idx, count)

    def in_one_leaf(touched) -> frozenset[int] | None:
        # among leaves that fit it at the same time, the one with the fewest free GPUs (best fit)
        fits = [(leaves[leaf].total, leaf) for leaf in touched if leaves[leaf].fits()]
        return leaves[min(fits)[1]].chosen() if fits else None

    found = (pool.chosen(), now) if pool.fits() else None  # the cross-leaf (nodes, start)
    if found is not None:
        nodes = in_one_leaf(leaves) if leaves is not None else found[0]
        if nodes is not None:
            return Reservation(job.id, now, nodes)
    for end, job_id in ends:
        if found is not None and end > found[1] + one_leaf_within:
            break  # one leaf frees too late: the cross-leaf reservation stands
        if jobs[job_id].preempted_by is not None:
            continue
        touched = set()
        for part in state.allocations[job_id].parts:
            if part.fraction == 1.0 and eligible(part.node):  # a shared GPU frees only when empty
                add(part.node, part.gpus)
                touched.add(cluster.nodes[part.node].leaf)
        start = max(end, now)
        if leaves is not None:
            nodes = in_one_leaf(touched)
            if nodes is not None:
                return Reservation(job.id, start, nodes)
        if found is None and pool.fits():
            if leaves is None:
                return Reservation(job.id, start, pool.chosen())
            found = (pool.chosen(), start)
    if found is not None:
        return Reservation(job.id, found[1], found[0])
    return Reservation(job.id, None, frozenset())


def may_backfill(reservation: Reservation | None, walltime: float, now: float) -> bool:
    """True when a job of this walltime ends before the reservation starts (so it may run
    anywhere); otherwise it must keep off ``reservation.nodes``."""
    return reservation is None or reservation.start is None or now + walltime <= reservation.start
