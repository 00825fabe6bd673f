"""Choosing pre-emption victims.

Who may be pre-empted for a job ``J`` that cannot otherwise start:
- never a tier-1 job, never a job inside its minimum run time, never one already signalled,
  never a fractional job (fractional jobs neither pre-empt nor are pre-empted), never a job
  that once pre-empted ``J`` (no two jobs pre-empt each other in turns);
- a tier-3 job, by any tier-1 or tier-2 job, and (to reclaim its queue's guarantee) by an urgent
  tier-3 job with a deadline, unless it has a deadline itself (:mod:`.deadlines`);
- a tier-2 job, only when ``J`` reclaims: ``J``'s queue is under its guarantee
  (:func:`~jupyter_gpusched.core.admission.under_guarantee`), the victim's queue is not ``J``'s,
  and taking the victim never brings the victim's queue (or an ancestor that is not also
  ``J``'s) below its guarantee.
The search goes node by node, over the nodes that need the fewest GPUs freed (16 more than the
job needs): on each it takes the cheapest victims (fewest tier-2 GPUs, then least lost work: GPUs
x seconds since each victim's last checkpoint) until the job's share fits there; a single-node
job takes the cheapest node, a gang the cheapest nodes. The chosen
victims are then released on the real :class:`ClusterState`, the job is placed by
:func:`find_placement` itself, only the victims whose GPUs it uses are kept, and the state is
restored.
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobs import Job
from .placement import find_placement, models_for, node_fits
from .quotas import Queue, QueueTree
from .settings import PolicySettings
from .state import ClusterState, Placement

NODES_EXAMINED = 16  # nodes examined closely per attempt, beyond the ones a gang needs


@dataclass(frozen=True)
class VictimSearch:
    state: ClusterState
    tree: QueueTree
    settings: PolicySettings
    topology: bool


def lost_work(job: Job, now: float, settings: PolicySettings) -> float:
    """GPU-seconds a victim loses if stopped now: the work since its last checkpoint."""
    ran = 0.0 if job.start_time is None else now - job.start_time
    since_checkpoint = 0.0 if settings.checkpoint_on_signal else ran % settings.checkpoint_interval
    return job.gpus * since_checkpoint


def find_victims(
    ctx: VictimSearch,
    job: Job,
    queue: Queue,
    jobs: dict[str, Job],
    room: list[int],
    leaving: list[float],
    now: float,
    reclaim: bool,
    limit_node: Queue | None,
    one_leaf: bool = False,
    urgent: bool = False,
) -> tuple[Placement, list[Job]] | None:
    """The victims to pre-empt so that ``job`` can start, and where it will run; or None.

    ``room[node]`` bounds what pre-emption could free on each node (the GPUs of running tier-3
    jobs there, plus tier-2 when reclaiming); nodes where even that is too little are skipped.
    ``leaving[node]``: the part of it held by jobs already signalled, which no search may take:
    a node where the rest is too little is passed by without looking at its jobs (the same
    nodes are examined, and the same answer given, as looking at each).
    """
    state, cluster = ctx.state, ctx.state.cluster
    per_node = job.gpus_per_node or (job.gpus if job.gpus <= cluster.max_node_gpus else None)
    chain = {id(q) for q in queue.chain()}
    guard = _GuaranteeGuard(ctx.tree, chain)
    minimum_run = {tier: t.minimum_run_time for tier, t in ctx.settings.tiers.items()}

    def eligible(victim: Job) -> bool:
        if victim.tier == 1 or victim.preempted_by is not None or victim.fractional:
            return False
        if victim.id in job.preemptors:
            return False  # it pre-empted this job: never in turns (an urgent tier-3 job can
            # reclaim from the tier-2 job that took its GPUs for plain priority, and back)
        if not victim.gpus:
            return False  # a CPU-only job frees no GPU
        if now - victim.start_time < minimum_run[victim.tier]:
            return False
        if victim.tier == 2 and not (reclaim and _other_queue(ctx.tree, victim, chain)):
            return False
        if victim.tier == 3 and job.tier == 3 and (not urgent or victim.deadline is not None):
            return False  # tier 3 gives way to tier 3 only for an urgent deadline, never in turns
        return limit_node is None or _under(ctx.tree.get(victim.queue), limit_node)

    def cost(victim: Job) -> tuple:
        return (victim.tier == 2, lost_work(victim, now, ctx.settings), victim.gpus, victim.id)

    options = []  # (cost, node, victims): the cheapest way to make room on each node
    need = per_node or 1
    nodes = cluster.nodes
    promising = _promising_nodes(state, job, need, room, NODES_EXAMINED + job.gpus // need)
    if per_node and len(promising) < job.gpus // per_node:
        return None  # a gang of n nodes needs n nodes where room can be made
    for idx in promising:
        free = state.free[idx]
        if free + room[idx] - leaving[idx] < need - 1e-6:
            continue  # what pre-emption could free here is leaving for another claim already
        node = nodes[idx]
        if job.gpu_models is not None and node.gpu_model not in job.gpu_models:
            continue
        if not node_fits(state, job, idx, 0.0):  # labels
            continue
        local = []
        for holder in state.holders[idx]:
            victim = jobs.get(holder)  # (a claim's name is no running job)
            if victim is not None and eligible(victim):
                local.append(victim)
        if len(local) > 1:
            local.sort(key=cost)
        chosen: list[Job] = []
        for victim in local:
            if free >= (per_node or node.gpus):
                break
            if guard.allows(victim):
                chosen.append(victim)
                free += sum(p.gpus for p in state.allocations[victim.id].parts if p.node == idx)
        if free < need or (not chosen and per_node):
            continue
        total = (sum(v.gpus for v in chosen if v.tier == 2), sum(cost(v)[1] for v in chosen))
        options.append(((*total, len(chosen), idx), idx, chosen, free))
    if not options:
        return None
    options.sort()
    if per_node == job.gpus:  # one node: the cheapest option
        _, idx, chosen, _ = options[0]
        picked = [chosen]
    else:
        count = job.gpus // per_node if per_node else None
        picked, gained = [], 0
        for _, _, chosen, free in options:
            picked.append(chosen)
            gained += free
            if (count is not None and len(picked) == count) or (
                count is None and gained >= job.gpus
            ):
                break
        else:
            return None
    victims = list({v.id: v for group in picked for v in group}.values())
    return _verify(ctx, job, victims, guard, limit_node, one_leaf)


def _promising_nodes(state, job, need: int, room: list[int], wanted: int) -> list[int]:
    """Up to ``wanted`` nodes where pre-emption could make room, those with the most free GPUs
    (the fewest to free) first; nodes by index within a leaf, leaves by name."""
    out: list[int] = []
    models = models_for(state, job)
    for count in range(len(next(iter(state.index.values()))) - 1, -1, -1):
        for model in models:
            by_leaf = state.index[model][count]
            for leaf in sorted(by_leaf):
                hits = [idx for idx in by_leaf[leaf] if count + room[idx] >= need]
                if hits:
                    hits.sort()
                    out.extend(hits[: wanted - len(out)])
                    if len(out) >= wanted:
                        return out
    return out


def _verify(ctx, job, victims, guard, limit_node, one_leaf=False):
    """Release ``victims`` on the real state, place the job, keep only the victims whose GPUs
    it uses, and restore the state."""
    state = ctx.state
    for victim in victims:
        if not guard.allows(victim):
            return None
        guard.take(victim)
    saved = {v.id: state.release(v.id) for v in victims}
    try:
        placement = find_placement(state, job, topology=ctx.topology, one_leaf=one_leaf)
    finally:
        for victim_id, held in saved.items():
            state.take(victim_id, held)
    if placement is None:
        return None
    # keep the victims whose GPUs the job uses, and on its nodes enough others for its CPUs
    # and memory (cheapest first: ``victims`` is in cost order per node)
    used = {p.node: p for p in placement.parts}
    needed = [
        v
        for v in victims
        if any(p.mask & used[p.node].mask for p in state.allocations[v.id].parts if p.node in used)
    ]
    for idx, part in used.items():
        cpus, memory = state.cpu_free[idx], state.mem_free[idx]
        for victim in victims:
            for held in state.allocations[victim.id].parts:
                if held.node == idx and victim in needed:
                    cpus, memory = cpus + held.cpus, memory + held.memory_gb
        for victim in victims:
            if cpus >= part.cpus - 1e-9 and memory >= part.memory_gb - 1e-9:
                break
            for held in state.allocations[victim.id].parts:
                if held.node == idx and victim not in needed:
                    needed.append(victim)
                    cpus, memory = cpus + held.cpus, memory + held.memory_gb
    if limit_node is not None:
        over = limit_node.running + limit_node.claimed + job.gpus - limit_node.limit
        if sum(v.gpus for v in needed) < over - 1e-9:
            return None
    return (placement, needed) if needed else None


def _other_queue(tree: QueueTree, victim: Job, preemptor_chain: set) -> bool:
    queue = tree.get(victim.queue)
    return queue is not None and id(queue) not in preemptor_chain


def _under(queue: Queue | None, ancestor: Queue) -> bool:
    return queue is not None and any(node is ancestor for node in queue.chain())


class _GuaranteeGuard:
    """Keeps tier-2 victims from taking their queues (or ancestors that are not the
    pre-emptor's) below their guarantees, counting the victims already taken."""

    def __init__(self, tree: QueueTree, preemptor_chain: set):
        self.tree, self.chain = tree, preemptor_chain
        self.taken: dict[int, float] = {}  # id(queue) -> tier-2 GPUs taken under it

    def allows(self, victim: Job) -> bool:
        """Tier-3 victims are always allowed; a tier-2 victim only while its queue stays at or
        above its guarantee, counting every victim already taken from it (any tier) and the
        victims of other claims still in their grace period (``leaving``)."""
        if victim.tier != 2:
            return True
        for node in self.tree.get(victim.queue).chain():
            if id(node) in self.chain:
                continue
            left = node.running - node.leaving - self.taken.get(id(node), 0.0)
            if left - victim.gpus < node.guaranteed - 1e-9:
                return False
        return True

    def take(self, victim: Job) -> None:
        queue = self.tree.get(victim.queue)
        if queue is not None:
            for node in queue.chain():
                self.taken[id(node)] = self.taken.get(id(node), 0.0) + victim.gpus
