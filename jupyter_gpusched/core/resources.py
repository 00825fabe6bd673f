"""CPUs and memory: jobs without GPUs (``gpus: 0``), and the queues' CPU and memory limits.

A CPU-only notebook server or batch job goes through the same queue, quotas and pass as a GPU
job, with these rules (docs/engine.md, "Jobs without GPUs"):

- it asks for CPUs or memory (``cpus`` or ``memory_gb`` above 0: a job that asks for nothing
  could not be bounded by anything), and for no GPU shape (no ``gpu_fraction`` below 1, no
  ``gpus_per_node``, no ``gpu_model``);
- it runs on one node, of any GPU model and anywhere in the topology; the node's labels must
  match, and it must have the CPUs and memory free. Among the nodes that hold it: the one with
  the fewest free GPUs (CPU-only work keeps off the nodes whose free GPUs will need their
  CPUs), then the fewest CPUs left free (best fit), then the lowest index;
- it orders with the other jobs of its tier (tier, admin priority, its queue's fair share, age);
  it adds nothing to fair-share usage (it holds no GPU-seconds);
- it never pre-empts and is never pre-empted (it holds no GPUs to take or to give), it takes
  no reservation, and a blocked CPU-only job neither stops a quick pass nor counts against the
  backfill depth: it never delays a GPU job;
- on the nodes reserved for the blocked GPU job at the head of the queue it starts only if the
  CPUs and memory that job asks for stay free there, so it never delays that job either.

Queue limits (``cpus: {limit: N}`` and ``memory_gb: {limit: N}`` in the queue file) bound the
CPUs and memory that running jobs of the queue's subtree ask for, GPU jobs included; like the
GPU limit a parent's limit bounds its children together. A job waits at one with a ``policy``
reason (``queue-cpu-limit`` / ``queue-memory-limit``), and is rejected if it asks for more
than the limit alone.
"""

from __future__ import annotations

from . import reasons
from .jobs import Job, Reason
from .state import Part, Placement

#: The resource fields of a queue entry: queue-file key -> (Queue attribute, unit in messages).
QUEUE_RESOURCES = {"cpus": ("cpu_limit", "CPUs"), "memory_gb": ("memory_limit", "GB of memory")}


def cpu_only_problem(job: Job) -> tuple[str, str] | None:
    """(message, field) when a 0-GPU request is malformed, else None."""
    if job.gpus != 0:
        return None
    if not (job.cpus or job.memory_gb):
        return (
            "a job with 'gpus' 0 must ask for 'cpus' or 'memory_gb' (above 0): "
            "the scheduler places it by them",
            "cpus",
        )
    if job.gpu_fraction != 1.0:
        return "'gpu_fraction' needs gpus = 1; this job asks for no GPU", "gpu_fraction"
    if job.gpus_per_node is not None:
        return "'gpus_per_node' needs GPUs; this job asks for none", "gpus_per_node"
    if job.gpu_models is not None:
        return "'gpu_model' needs GPUs; this job asks for none", "gpu_model"
    return None


def _asks(job: Job) -> dict[str, float]:
    return {"cpus": job.cpus or 0.0, "memory_gb": job.memory_gb or 0.0}


def resource_rejection(job: Job, queue) -> tuple[str, str] | None:
    """Why ``job`` can never start under its queue chain's CPU/memory limits, or None."""
    asks = _asks(job)
    for node in queue.chain():
        for key, (limit_name, unit) in QUEUE_RESOURCES.items():
            limit = getattr(node, limit_name)
            if asks[key] > limit + 1e-9:
                return (
                    f"asks for {asks[key]:g} {unit}, more than queue {node.label()}'s limit "
                    f"of {limit:g}",
                    key,
                )
    return None


def resource_block(job: Job, queue) -> Reason | None:
    """The policy reason a CPU or memory limit on ``queue``'s chain keeps ``job`` waiting."""
    if not job.cpus and not job.memory_gb:
        return None  # it asks for neither
    asks = _asks(job)
    for node in queue.chain():
        for key, (limit_name, _unit) in QUEUE_RESOURCES.items():
            limit = getattr(node, limit_name)
            # what runs, and what jobs waiting for their pre-emption victims will take
            if key == "cpus":
                used = node.cpus_running + node.cpus_claimed
            else:
                used = node.memory_running + node.memory_claimed
            if asks[key] and used + asks[key] > limit + 1e-9:
                figures = {"limit": limit, "used": used, "asks": asks[key]}
                if node is queue:
                    entry = _LIMIT_REASONS[key]
                    return entry.reason(queue=node.label(), **figures)
                # an ancestor the user may not see listed among their queues: say which
                entry = _ANCESTOR_LIMIT_REASONS[key]
                return entry.reason(queue=node.label(), leaf=queue.label(), **figures)
    return None


_LIMIT_REASONS = {"cpus": reasons.QUEUE_CPU_LIMIT, "memory_gb": reasons.QUEUE_MEMORY_LIMIT}
_ANCESTOR_LIMIT_REASONS = {
    "cpus": reasons.QUEUE_ABOVE_CPU_LIMIT,
    "memory_gb": reasons.QUEUE_ABOVE_MEMORY_LIMIT,
}


def place_cpu_only(state, job: Job, exclude, reserved=None):
    """The node for a 0-GPU job now (a Placement with an empty GPU mask), or None.

    ``reserved`` is ``(nodes, cpus, memory_gb)`` of the reservation of the blocked GPU job: on
    those nodes this job must leave that job's CPUs and memory free."""
    cpus, memory = job.cpus or 0.0, job.memory_gb or 0.0
    best = None
    for idx, node in enumerate(state.cluster.nodes):
        if idx in exclude or not state.schedulable(idx):
            continue
        if job.labels and any(node.labels.get(k) != v for k, v in job.labels.items()):
            continue
        cpu_left, mem_left = state.cpu_free[idx] - cpus, state.mem_free[idx] - memory
        if cpu_left < -1e-9 or mem_left < -1e-9:
            continue
        if (
            reserved is not None
            and idx in reserved[0]
            and (cpu_left < reserved[1] - 1e-9 or mem_left < reserved[2] - 1e-9)
        ):
            continue  # it would take CPUs or memory the reserved job needs there
        key = (state.free[idx], cpu_left, idx)
        if best is None or key < best:
            best = key
    if best is None:
        return None
    return Placement((Part(best[-1], 0, cpus, memory),))


def cpu_only_reason(job: Job, blocked_by_reservation: str | None) -> Reason:
    """Why a 0-GPU job found no node (``blocked_by_reservation``: the job holding the
    reservation, when only its nodes would have had room)."""
    cpus, memory = job.cpus or 0, job.memory_gb or 0
    if blocked_by_reservation is not None:
        return reasons.RESERVATION_CPUS.reason(
            cpus=cpus, memory_gb=memory, job=blocked_by_reservation
        )
    return reasons.CPUS_BUSY.reason(cpus=cpus, memory_gb=memory)


def place_cpu_only_or_reason(state, job: Job, exclude, reservation, jobs: dict, failed: dict):
    """A placement for a 0-GPU job, or the Reason it waits. ``reservation``: the reservation
    it must not delay (None when it is ahead of it, or ends before its start). ``failed``: the
    pass's reasons by request shape (what did not fit once does not fit later in the pass:
    starts only take CPUs and memory), so a queue of equal CPU-only servers costs one scan."""
    shape = (
        "cpu-only",
        job.cpus,
        job.memory_gb,
        tuple(sorted(job.labels.items())),
        exclude,
        None if reservation is None else (reservation.job_id, reservation.nodes),
    )
    if shape in failed:
        return failed[shape]
    reason = _place_or_reason(state, job, exclude, reservation, jobs)
    if isinstance(reason, Reason):
        failed[shape] = reason
    return reason


def _place_or_reason(state, job: Job, exclude, reservation, jobs: dict):
    reserved = None
    if reservation is not None:
        holder = jobs[reservation.job_id]
        reserved = (reservation.nodes, holder.cpus or 0.0, holder.memory_gb or 0.0)
    placement = place_cpu_only(state, job, exclude, reserved)
    if placement is not None:
        return placement
    if reserved is not None and place_cpu_only(state, job, exclude) is not None:
        return cpu_only_reason(job, reservation.job_id)
    return cpu_only_reason(job, None)
