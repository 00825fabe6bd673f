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
    (then it is the cross-leaf one, as without topology).

    This walk is the engine's hottest loop at scale, so it is written for speed (the plain
    version it replaced is kept as the reference in ``tests/test_reservation_walk.py``):
    - a job of one node, or of k GPUs on each of n nodes, that names no GPU model and no label
      (most jobs) starts from the free GPUs the cluster state counts (in all, per leaf, nodes
      with k free) instead of adding up every node, and reads a node's free GPUs when an end
      first touches it;
    - the fit is tested only after an end that can change it: one that made a node ready (k
      GPUs free then), or, for a gang spread as it fits, any that freed GPUs it may use."""
    cluster = state.cluster
    node_state, labels = state.node_state, tuple(job.labels.items())

    def eligible(idx: int) -> bool:
        node = cluster.nodes[idx]
        return (
            node_state[idx] == "up"
            and (job.gpu_models is None or node.gpu_model in job.gpu_models)
            and all(node.labels.get(k) == v for k, v in labels)
        )

    single = (job.gpus_per_node or job.gpus) == job.gpus and job.gpus <= cluster.max_node_gpus
    shaped = single or bool(job.gpus_per_node)  # it needs whole nodes with ``threshold`` free
    threshold = job.gpus if single else (job.gpus_per_node or 1)
    any_node = job.gpu_models is None and not labels
    counted = shaped and any_node  # start from the state's counts (see above)
    pool = _Pool(job, single, threshold)
    leaves: dict[str, _Pool] | None = {} if one_leaf_within is not None else None
    avail, ready = pool.avail, pool.ready  # (a node's GPUs free then: the same in its leaf's)

    def leaf_pool(leaf: str) -> _Pool:
        in_leaf = leaves.get(leaf)
        if in_leaf is None:
            in_leaf = leaves[leaf] = _Pool(job, single, threshold)
            if counted:
                in_leaf.total = state.leaf_free[leaf]
        return in_leaf

    if counted:
        pool.total = state.free_total
    for model, buckets in state.index.items():  # (the index holds the up nodes, by free GPUs)
        if job.gpu_models is not None and model not in job.gpu_models:
            continue
        for count in range(threshold if counted else 1, len(buckets)):
            for leaf, members in buckets[count].items():
                for idx in members:
                    if labels and not all(cluster.nodes[idx].labels.get(k) == v for k, v in labels):
                        continue
                    if counted:
                        avail[idx] = count
                        ready.add(idx)
                    else:
                        pool.add(idx, count)
                    if leaves is not None:
                        in_leaf = leaf_pool(leaf)
                        if counted:
                            in_leaf.avail[idx] = count
                            in_leaf.ready.add(idx)
                        else:
                            in_leaf.add(idx, count)

    def in_one_leaf(touched) -> frozenset[int] | None:
        # among leaves that fit it at the same time, the one with the fewest free GPUs (best fit)
        fits = [(leaves[leaf].total, leaf) for leaf in touched if leaves[leaf].fits()]
        return leaves[min(fits)[1]].chosen() if fits else None

    found = (pool.chosen(), now) if pool.fits() else None  # the cross-leaf (nodes, start)
    if found is not None:
        nodes = in_one_leaf(leaves) if leaves is not None else found[0]
        if nodes is not None:
            return Reservation(job.id, now, nodes)
    free, allocations, leaf_of = state.free, state.allocations, cluster.leaf_of
    for end, job_id in ends:
        if found is not None and end > found[1] + one_leaf_within:
            break  # one leaf frees too late: the cross-leaf reservation stands
        if jobs[job_id].preempted_by is not None:
            continue
        changed = None  # the leaves where the job may fit now and did not before
        for part in allocations[job_id].parts:
            idx = part.node
            if part.fraction != 1.0:  # a shared GPU frees only when empty
                continue
            if not (node_state[idx] == "up" if any_node else eligible(idx)):
                continue
            gpus = part.gpus
            before = avail.get(idx)
            if before is None:
                before = free[idx] if counted else 0
            free_then = avail[idx] = before + gpus
            pool.total += gpus
            newly_ready = free_then >= threshold > before
            if newly_ready:
                ready.add(idx)
            if leaves is not None:
                in_leaf = leaf_pool(leaf_of[idx])
                in_leaf.avail[idx] = free_then
                in_leaf.total += gpus
                if newly_ready:
                    in_leaf.ready.add(idx)
            if newly_ready or not shaped:
                if changed is None:
                    changed = set()
                changed.add(leaf_of[idx])
        if changed is None:
            continue
        start = max(end, now)
        if leaves is not None:
            nodes = in_one_leaf(changed)
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
