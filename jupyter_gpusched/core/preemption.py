"""Choosing pre-emption victims.

Who may be pre-empted for a job ``J`` that cannot otherwise start:
- never a tier-1 job, never a job inside its minimum run time, never one already signalled;
- a tier-3 job, by any tier-1 or tier-2 job;
- a tier-2 job, only when ``J`` reclaims: ``J`` is tier 1 or its queue is under its guarantee
  (:func:`~jupyter_gpusched.core.admission.under_guarantee`), the victim's queue runs above its
  guarantee, and taking the victim never brings the victim's queue (or an ancestor that is not
  also ``J``'s) below its guarantee.
Among valid victim sets the search prefers the lowest tier, then the least lost work
(GPUs x seconds since the victim's last checkpoint). It tries the chosen set on the real
:class:`ClusterState` by releasing the victims and restoring them afterwards, so the placement
it returns is one that :func:`find_placement` itself would make.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobs import Job
from .placement import find_placement
from .quotas import Queue, QueueTree
from .settings import PolicySettings
from .state import ClusterState, Placement


@dataclass(frozen=True)
class VictimSearch:
    state: ClusterState
    tree: QueueTree
    settings: PolicySettings
    topology: bool


def lost_work(job: Job, now: float, settings: PolicySettings) -> float:
    """GPU-seconds a victim loses if stopped now: the work since its last checkpoint."""
    ran = now - (job.start_time or now)
    since_checkpoint = 0.0 if settings.checkpoint_on_signal else ran % settings.checkpoint_interval
    return job.gpus * since_checkpoint


def find_victims(
    ctx: VictimSearch,
    job: Job,
    queue: Queue,
    running: list[Job],
    now: float,
    reclaim: bool,
    limit_node: Queue | None,
) -> tuple[Placement, list[Job]] | None:
    """The victims to pre-empt so that ``job`` can start, and where it will run; or None."""
    chain = {id(q) for q in queue.chain()}
    candidates = []
    for victim in running:
        if victim.tier == 1 or victim.preempted_by is not None or victim.id == job.id:
            continue
        if now - victim.start_time < ctx.settings.tiers[victim.tier].minimum_run_time:
            continue
        if victim.tier == 2 and not reclaim:
            continue
        if victim.tier == 3 and job.tier == 3:
            continue
        if limit_node is not None and not _under(ctx.tree.get(victim.queue), limit_node):
            continue
        candidates.append(victim)
    if not candidates:
        return None
    candidates.sort(key=lambda v: (-v.tier, lost_work(v, now, ctx.settings), v.gpus, v.id))
    needed = 0.0
    if limit_node is not None:
        needed = limit_node.running + limit_node.claimed + job.gpus - limit_node.limit
    return _search(ctx, job, candidates, needed, chain)


def _under(queue: Queue | None, ancestor: Queue) -> bool:
    return queue is not None and any(node is ancestor for node in queue.chain())


def _above_guarantee(tree: QueueTree, victim: Job, preemptor_chain: set, taken=None) -> bool:
    """Taking ``victim`` (after the tier-2 victims ``taken``) keeps its queue, and each ancestor
    that is not also the pre-emptor's, at or above its guarantee."""
    queue = tree.get(victim.queue)
    if queue is None or id(queue) in preemptor_chain:
        return False  # the same queue: nothing was borrowed from the pre-emptor
    for node in queue.chain():
        if id(node) in preemptor_chain:
            continue
        already = sum(
            t.gpus for t in taken or () if t.tier == 2 and _under(tree.get(t.queue), node)
        )
        if node.running - already - victim.gpus < node.guaranteed - 1e-9:
            return False
    return True


def _search(ctx: VictimSearch, job: Job, candidates: list[Job], needed: float, chain: set):
    """Release candidates cheapest first until the job fits, then give back the ones that turn
    out unnecessary (most expensive first). The state is restored before returning."""
    state = ctx.state
    saved: dict[str, Placement] = {}
    released: list[Job] = []
    freed = 0.0
    placement = None
    tries = 0
    try:
        for victim in candidates:
            if victim.tier == 2 and not _above_guarantee(ctx.tree, victim, chain, released):
                continue
            saved[victim.id] = state.release(victim.id)
            released.append(victim)
            freed += victim.gpus
            if _free_for(state, job.gpu_models) < job.gpus or freed < needed - 1e-9:
                continue
            tries += 1
            placement = find_placement(state, job, topology=ctx.topology)
            if placement is not None or tries > 64:
                break
        if placement is None:
            return None
        for victim in reversed(released[:-1]):  # prune: keep each one running if the job fits
            state.take(victim.id, saved[victim.id])
            trial = None
            if freed - victim.gpus >= needed - 1e-9:
                trial = find_placement(state, job, topology=ctx.topology)
            if trial is not None:
                placement, freed = trial, freed - victim.gpus
                released.remove(victim)
            else:
                state.release(victim.id)
        return placement, released
    finally:
        for victim_id, victim_placement in saved.items():
            if victim_id not in state.allocations:
                state.take(victim_id, victim_placement)


def _free_for(state: ClusterState, models) -> int:
    if models is None:
        return state.free_total
    return sum(free for model, free in state.model_free.items() if model in models)
