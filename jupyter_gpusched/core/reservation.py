"""Reservation for the highest-priority blocked job, and the EASY backfill test.

The blocked job's *shadow time* is the earliest time it would fit if running jobs end at their
walltime estimates (a job past its estimate is taken to end now). Its *reserved nodes* are the
nodes it would use then. A lower-priority job may start now only if it ends before the shadow
time, or if it keeps off the reserved nodes: either way the reservation is not delayed.

GPUs that a pre-empting job has claimed, and the GPUs of its victims, are not counted: they are
already promised. Leaf and spine topology is ignored here (counts per node only).
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


def reserve(state: ClusterState, job: Job, ends, jobs: dict, now: float) -> Reservation:
    """``ends`` is the running jobs' (estimated end, job id) in ascending order."""
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
    avail: dict[int, int] = {}  # eligible node -> GPUs free at the time being considered
    ready: set[int] = set()  # nodes with at least ``threshold`` GPUs free then
    total = 0

    def add(idx: int, gpus: int) -> None:
        nonlocal total
        avail[idx] = avail.get(idx, 0) + gpus
        total += gpus
        if avail[idx] >= threshold:
            ready.add(idx)

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
                    avail[idx] = count  # (the first time this node is seen)
                    total += count
                    if count >= threshold:
                        ready.add(idx)

    def chosen() -> frozenset[int] | None:
        if single:
            return frozenset((min(ready, key=lambda i: (avail[i], i)),)) if ready else None
        if job.gpus_per_node:
            count = job.gpus // job.gpus_per_node
            return frozenset(sorted(ready)[:count]) if len(ready) >= count else None
        if total < job.gpus:
            return None
        nodes, need = [], job.gpus
        for idx in sorted(avail, key=lambda i: (-avail[i], i)):
            nodes.append(idx)
            need -= avail[idx]
            if need <= 0:
                break
        return frozenset(nodes)

    nodes = chosen()
    if nodes is not None:
        return Reservation(job.id, now, nodes)
    for end, job_id in ends:
        if jobs[job_id].preempted_by is not None:
            continue
        for part in state.allocations[job_id].parts:
            if part.fraction == 1.0 and eligible(part.node):  # a shared GPU frees only when empty
                add(part.node, part.gpus)
        nodes = chosen()
        if nodes is not None:
            return Reservation(job.id, max(end, now), nodes)
    return Reservation(job.id, None, frozenset())


def may_backfill(reservation: Reservation | None, walltime: float, now: float) -> bool:
    """True when a job of this walltime ends before the reservation starts (so it may run
    anywhere); otherwise it must keep off ``reservation.nodes``."""
    return reservation is None or reservation.start is None or now + walltime <= reservation.start
