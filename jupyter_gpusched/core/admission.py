"""Admission: which jobs can never run here (rejected at submit), and which must wait for policy.

Both read the cluster and the quota tree; neither changes anything.
"""

from __future__ import annotations

import math

from . import reasons
from .cluster import Cluster
from .errors import ConfigError
from .jobs import KINDS, TIERS, Job, Reason
from .quotas import Queue, QueueTree
from .resources import cpu_only_problem, resource_block, resource_rejection
from .submission import unknown_gpu_model
from .wording import gpus_text

#: The smallest share of a GPU the engine places: shares are tracked to six decimals, so a much
#: smaller one could not be told from none (the service asks for more: requests.MIN_GPU_FRACTION).
MIN_SHARE = 1e-4
QUOTED = 80  # characters of a request's labels quoted in a rejection (stored in the audit log)


def validate(job: Job) -> None:
    """Raise ConfigError for a malformed request (bad input, not a rejection)."""

    def fail(message, field):
        raise ConfigError(message, entry=f"job {job.id}", field=field)

    if isinstance(job.gpus, bool) or not isinstance(job.gpus, int) or job.gpus < 0:
        fail(f"'gpus' must be a whole number >= 0, got {job.gpus!r}", "gpus")
    problem = cpu_only_problem(job)  # gpus 0: CPUs or memory, and no GPU shape
    if problem is not None:
        fail(*problem)
    if not MIN_SHARE <= job.gpu_fraction <= 1 or (job.gpu_fraction < 1 and job.gpus != 1):
        fail(
            f"'gpu_fraction' must be from {MIN_SHARE} to 1, and below 1 only with gpus = 1; got "
            f"{job.gpu_fraction!r} with gpus = {job.gpus}",
            "gpu_fraction",
        )
    if job.tier not in TIERS:
        fail(f"'tier' must be 1, 2 or 3, got {job.tier!r}", "tier")
    if job.kind not in KINDS:
        fail(f"'kind' must be batch or notebook, got {job.kind!r}", "kind")
    if job.gpus_per_node is not None and (job.gpus_per_node < 1 or job.gpus % job.gpus_per_node):
        fail(
            f"'gpus_per_node' ({job.gpus_per_node}) must divide 'gpus' ({job.gpus})",
            "gpus_per_node",
        )
    for name in ("cpus", "memory_gb", "walltime"):
        value = getattr(job, name)
        if value is not None and value < 0:
            fail(f"'{name}' must not be negative, got {value!r}", name)


class Capacity:
    """What the nodes that match a job's GPU models and labels add up to (cached per kind)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self._cache: dict[tuple, tuple] = {}
        self._holding: dict[tuple, int] = {}

    def of(self, job: Job) -> tuple[int, list[tuple[int, float, float]], float, float]:
        """(total GPUs, (GPUs, CPUs, memory) of each matching node, total CPUs, total memory)."""
        key = (job.gpu_models, tuple(sorted(job.labels.items())))
        if key not in self._cache:
            nodes = [
                n
                for n in self.cluster.nodes
                if (job.gpu_models is None or n.gpu_model in job.gpu_models)
                and all(n.labels.get(k) == v for k, v in job.labels.items())
            ]
            self._cache[key] = (
                sum(n.gpus for n in nodes),
                [(n.gpus, n.cpus or math.inf, n.memory_gb or math.inf) for n in nodes],
                sum(n.cpus or math.inf for n in nodes),
                sum(n.memory_gb or math.inf for n in nodes),
            )
        return self._cache[key]

    def nodes_holding(self, job: Job, gpus: int, cpus: float, memory: float) -> int:
        """How many matching nodes have at least these GPUs, CPUs and memory (cached)."""
        key = (job.gpu_models, tuple(sorted(job.labels.items())), gpus, cpus, memory)
        if key not in self._holding:
            self._holding[key] = sum(
                1
                for node_gpus, node_cpus, node_memory in self.of(job)[1]
                if node_gpus >= gpus and cpus <= node_cpus and memory <= node_memory
            )
        return self._holding[key]


def rejection(
    job: Job, capacity: Capacity, tree: QueueTree, quotas: bool, guarantees: bool = True
) -> tuple[str, str] | None:
    """Why ``job`` can never run on this cluster under these quotas, and the request field
    that says so (``gpus``, ``gpu_model``, ``labels``, ...), or None."""
    cluster = capacity.cluster
    if (model := unknown_gpu_model(job, cluster)) is not None:
        return model
    total, node_sizes, cpus, memory = capacity.of(job)
    if not node_sizes:
        labels = repr(job.labels)
        labels = labels if len(labels) <= QUOTED else labels[: QUOTED - 3] + "..."
        return f"no node has the labels {labels}", "labels"
    if job.gpus > total:
        return f"asks for {gpus_text(job.gpus)} but the cluster has {total} that match", "gpus"
    per_node = job.gpus_per_node or (job.gpus if job.gpus <= cluster.max_node_gpus else None)
    if per_node:
        share = per_node / job.gpus  # of the job's CPUs and memory, on each of its nodes
        fitting = capacity.nodes_holding(
            job, per_node, (job.cpus or 0) * share, (job.memory_gb or 0) * share
        )
        if fitting < job.gpus // per_node:
            if job.gpus_per_node is None:
                return (
                    f"no node has {gpus_text(job.gpus)} with {job.cpus or 0:g} CPUs and "
                    f"{job.memory_gb or 0:g} GB of memory for it",
                    "gpus",
                )
            return (
                f"needs {job.gpus // job.gpus_per_node} nodes with {job.gpus_per_node} GPUs "
                f"each; the cluster has {fitting} that match",
                "gpus_per_node",
            )
    if job.gpus == 0 and not capacity.nodes_holding(job, 0, job.cpus or 0, job.memory_gb or 0):
        return (
            f"no node has {job.cpus or 0:g} CPUs and {job.memory_gb or 0:g} GB of memory for it",
            "cpus" if job.cpus else "memory_gb",
        )
    if job.cpus and job.cpus > cpus:
        return f"asks for {job.cpus:g} CPUs, more than the matching nodes have", "cpus"
    if job.memory_gb and job.memory_gb > memory:
        return (
            f"asks for {job.memory_gb:g} GB of memory, more than the matching nodes have",
            "memory_gb",
        )
    if not quotas:
        return None
    queue = tree.get(job.queue)
    if queue is None:
        return f"unknown queue {job.queue!r}", "queue"
    if not queue.is_leaf:
        return f"queue {queue.label()} has sub-queues; submit to one of them", "queue"
    for node in queue.chain():
        if job.gpus > node.limit:
            return (
                f"asks for {gpus_text(job.gpus)}, more than queue {node.label()}'s limit "
                f"of {node.limit:g}",
                "gpus",
            )
    if guarantees and job.tier == 1 and job.gpus > queue.guaranteed:
        return (
            f"a tier-1 job runs only inside its queue's guarantee; {queue.label()} guarantees "
            f"{gpus_text(queue.guaranteed)} and the job asks for {job.gpus}",
            "tier",
        )
    return resource_rejection(job, queue)


def policy_block(
    job: Job, queue: Queue, guarantees: bool = True
) -> tuple[Reason, Queue | None] | None:
    """The policy reason that keeps ``job`` waiting, or None when quotas let it start.

    The second item is the ancestor whose limit blocks (None for other reasons), which
    pre-emption may relieve by reclaiming borrowed GPUs from under it.
    """
    if guarantees and job.tier == 1 and queue.tier1_running + job.amount > queue.guaranteed + 1e-9:
        return (
            reasons.TIER1_GUARANTEE.reason(
                queue=queue.label(), used=queue.tier1_running, guaranteed=queue.guaranteed
            ),
            None,
        )
    # CPU and memory limits first: no pre-emption relieves them (reclaiming is for GPUs), so a
    # job over one must not pre-empt for a GPU limit and then start over its CPU limit
    block = resource_block(job, queue)
    if block is not None:
        return block, None
    for node in queue.chain():
        if node.running + node.claimed + job.amount > node.limit + 1e-9:
            used = node.running + node.claimed
            if node is queue:
                reason = reasons.QUEUE_LIMIT.reason(
                    queue=node.label(), limit=node.limit, used=used, asks=job.amount
                )
            else:  # an ancestor the user may not see listed among their queues: say which
                reason = reasons.QUEUE_ABOVE_LIMIT.reason(
                    queue=node.label(),
                    leaf=queue.label(),
                    limit=node.limit,
                    used=used,
                    asks=job.amount,
                )
            return reason, node
    return None


def under_guarantee(job: Job, queue: Queue) -> bool:
    """True when the job fits inside the guarantee of its queue and of every ancestor (the
    implicit root, which is the whole cluster, excepted)."""
    return all(
        node.running + node.claimed + job.amount <= node.guaranteed + 1e-9
        for node in queue.chain()
        if node.parent is not None
    )


def headroom(job: Job, queue: Queue, guarantees: bool) -> float:
    """GPUs the quotas let the (queue, tier) list of ``job`` start now."""
    room = min(node.limit - node.running - node.claimed for node in queue.chain())
    if job.tier == 1 and guarantees:
        room = min(room, queue.guaranteed - queue.tier1_running)
    return room


def user_block(job: Job, tree: QueueTree, running_by_user: dict, claimants) -> Reason | None:
    """The per-user limit that keeps ``job`` waiting, or None. ``running_by_user``: user ->
    (running GPUs, running jobs); ``claimants``: the jobs waiting for their pre-emption victims
    to leave (they count as running)."""
    limit = tree.user_limit(job.user)
    if limit is None:
        return None
    gpus, count = running_by_user.get(job.user, (0.0, 0))
    for claimant in claimants:
        if claimant.user == job.user and claimant.id != job.id:
            gpus, count = gpus + claimant.amount, count + 1
    if limit.gpus is not None and gpus + job.amount > limit.gpus + 1e-9:
        return reasons.USER_LIMIT_GPUS.reason(user=job.user, gpus=gpus, limit=limit.gpus)
    if limit.running_jobs is not None and count + 1 > limit.running_jobs:
        return reasons.USER_LIMIT_JOBS.reason(user=job.user, count=count, limit=limit.running_jobs)
    return None
