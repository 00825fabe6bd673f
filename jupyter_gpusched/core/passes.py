"""One scheduling pass: the pending jobs it is given, examined in priority order (see the steps
in :mod:`.scheduler`): each is started, pre-empts, reserves the GPUs that free soonest or keeps
the reason it waits.

Apart from :mod:`.scheduler`, which turns events into state and decides when a pass runs and
over which jobs; a pass reads and changes that state (``sched``: the
:class:`~.scheduler.Scheduler`), and leaves pre-emption to its :class:`~.claims.Preemptions`
and maintenance windows to its :class:`~.admin.Admin`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import reasons
from .admission import headroom, policy_block, user_block
from .jobs import Job
from .placement import find_placement, shape_reason
from .reservation import may_backfill, reserve
from .resources import place_cpu_only_or_reason
from .state import Placement

PREEMPTION_TRIES_PER_PASS = 8  # successful pre-emptions per pass; the first failure ends them


@dataclass
class Pass:
    """What one scheduling pass has learnt so far."""

    tries: int  # pre-emption attempts left
    blocked: int = 0  # jobs tried and not placed (the deep pass examines backfill.depth)
    reserved_key: tuple | None = None
    started: list = field(default_factory=list)
    # smallest request of each shape that did not fit, and why: larger ones need not try
    failed: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)
    # lists left out behind the reservation (see list_cannot_start), and what that test read
    # of the free GPUs, kept while nothing started: (free total, outside view)
    passed_over: set = field(default_factory=set)
    outside: tuple | None = None


def run_pass(sched, candidates, now, skip=None, deep=True, previous=None) -> bool:
    """Examine ``candidates`` in priority order; True if it stopped at a blocked job.

    Passes after submissions examine just the new jobs. Passes after something was freed
    examine the queue in order: a *quick* pass (like Slurm's main scheduler) stops at the
    first job blocked on capacity or placement; a *deep* one, at most every
    ``backfill.interval`` (and after a minimum run time ends), also backfills behind it and
    tries pre-emption, until ``backfill.depth`` jobs were blocked or nothing usable is
    left. Jobs a pass does not reach keep the reason of their last examination."""
    full = skip is not None
    tries = PREEMPTION_TRIES_PER_PASS if sched.policy.preemption and deep else 0
    pass_ = Pass(tries)
    stopped = False
    if sched.reservation is not None:
        pass_.reserved_key = sched._key(sched.reservation.job_id)
    for job_id in candidates:
        job = sched.jobs[job_id]
        if full and pass_is_over(sched, pass_, job, now):
            break
        if job_id in sched._claims:
            continue
        behind = pass_.reserved_key is not None and sched._key(job_id) > pass_.reserved_key
        if (
            behind
            and full
            and sched.pass_over_hopeless
            and list_cannot_start(sched, pass_, job, now)
        ):
            list_key = sched.pending.list_of(job)
            skip.add(list_key)  # it and the rest of its list keep the reason they have
            pass_.passed_over.add(list_key)
            continue
        outcome = evaluate(sched, job, now, sched.reservation if behind else None, pass_)
        if isinstance(outcome, Placement):
            sched._start(job, outcome, now)
            pass_.started.append(job)
            continue
        if outcome is None:  # it pre-empted: the claim holds its GPUs
            continue
        if job.gpus == 0:  # CPU-only: no pre-emption, no reservation, no stop (.resources)
            sched._set_reason(job, outcome)
            continue
        if full and outcome.family == "policy" and sched.policy.quotas:
            list_key = sched.pending.list_of(job)
            room = headroom(job, sched.tree.get(job.queue), sched.policy.guarantees)
            if room < sched.pending.smallest_in(list_key) - 1e-9:
                skip.add(list_key)  # no job of its list fits under the same quota
        if outcome.family in ("capacity", "placement"):
            if sched.preemptions.try_preempt(job, now, pass_):
                continue
            if outcome.family == "placement":  # (more GPUs than are free: nothing was tried)
                pass_.blocked += 1
            if sched.policy.backfill and (sched.reservation is None or not behind):
                if deep or previous is None or previous.job_id != job_id:
                    previous = reserve(sched.state, job, sched.ledger.ends, sched.jobs, now)
                sched.reservation = previous  # a quick pass keeps the last one's estimate
                pass_.reserved_key = sched._key(job_id)
                pass_.failed.clear()  # the reserved nodes changed
                outcome = outcome.with_eta(sched.reservation.start)
            if full and not deep:
                sched._set_reason(job, outcome)
                stopped = True
                break
        sched._set_reason(job, outcome)
    for job in pass_.started:
        sched._leave_pending(job)
    if full:
        sched.passed_over = pass_.passed_over
        sched.lists_left_out += len(pass_.passed_over)
    return stopped


def list_cannot_start(sched, pass_: Pass, job: Job, now: float) -> bool:
    """True when no job of ``job``'s list (which comes after the reservation) can do anything
    in the rest of this pass: none can start, pre-empt, or count against ``backfill.depth``.
    Each would wait on policy, on capacity or on the reservation, so the pass leaves the list
    out and its jobs keep the reason they have; the decisions are those of examining every job
    (``tests/test_incremental_pass.py`` runs both).

    It holds when the list has only whole-GPU jobs that take any GPU model; none pre-empts
    (tier 3, or no tries left); each would outlast the reservation, so it must keep off the
    reserved nodes; none fits outside them (k GPUs on each of n nodes needs n nodes with k
    free; a gang spread as it fits needs that many free in all); the reserved nodes have free
    GPUs (so the reason is the reservation, not the shape); no maintenance is planned; and no
    placement or capacity reason was cached this pass for jobs that keep off those nodes."""
    shapes = sched.pending.shapes.get(sched.pending.list_of(job))
    if shapes is None or shapes.other:
        return False
    if pass_.tries > 0 and not (job.tier == 3 and sched.tier_first):
        return False
    reservation = sched.reservation
    if reservation is None or reservation.start is None or sched.maintenance:
        return False
    if now + shapes.walltimes[0][0] <= reservation.start:
        return False  # its shortest job would end before the reservation starts: it may backfill
    state = sched.state
    if pass_.outside is None or pass_.outside[0] != state.free_total:
        pass_.outside = (state.free_total, outside_reservation(state, reservation.nodes))
    nodes_with_at_least, outside_total, reserved_free = pass_.outside[1]
    if not reserved_free:
        return False
    for per_node, nodes in shapes.on_nodes:
        if nodes_with_at_least[per_node] >= nodes:
            return False
    if shapes.spanning and min(shapes.spanning) <= outside_total:
        return False
    # a reason cached this pass for jobs that keep off the reserved nodes (see evaluate's
    # shape): had they been examined, one of these could have been theirs
    return all(r.family == "policy" for shape, r in pass_.reasons.items() if shape[7])


def outside_reservation(state, reserved: frozenset) -> tuple[list[int], int, int]:
    """(for each c, the schedulable nodes outside ``reserved`` with at least c GPUs free; the
    GPUs free outside it; the GPUs free on it)."""
    by_free = list(state.nodes_by_free)
    reserved_up = 0
    for n in reserved:
        if state.schedulable(n):
            by_free[state.free[n]] -= 1
            reserved_up += state.free[n]
    at_least, running = [0] * len(by_free), 0
    for count in range(len(by_free) - 1, -1, -1):
        running += by_free[count]
        at_least[count] = running
    reserved_any = sum(state.free[n] for n in reserved)  # (a drained node's too: see evaluate)
    return at_least, state.free_total - reserved_up, reserved_any


def pass_is_over(sched, pass_: Pass, job: Job, now: float) -> bool:
    """True when neither ``job`` nor any job after it can start in this pass."""
    if pass_.blocked >= sched.settings.backfill_depth:
        return True
    if pass_.tries > 0 and job.tier < 3:
        return False  # it may pre-empt (tiers are strict: after tier 3 only tier 3 comes)
    smallest = sched.pending.smallest_request()
    if sched.state.free_total + sched.state.shared_room_total < smallest - 1e-9:
        return True
    r = sched.reservation
    if r is None or r.start is None:
        return False
    outside = sched.state.free_total - sum(sched.state.free[n] for n in r.nodes)
    # a job that would outlast the reservation must fit outside its nodes
    return outside < smallest and now + sched.pending.shortest_walltime() > r.start


def evaluate(sched, job: Job, now: float, reservation, pass_: Pass):
    """A placement to start now, the Reason it waits, or None if it pre-empted."""
    queue = sched.tree.get(job.queue) if sched.policy.quotas else sched.tree.root
    if sched.policy.quotas:
        block = policy_block(job, queue, sched.policy.guarantees)
        if block is not None:
            reason, limit_node = block
            if (
                limit_node not in (None, queue)
                and pass_.tries > 0
                and sched.preemptions.reclaims(job)
            ):
                sched._set_reason(job, reason)
                if sched.preemptions.try_preempt(job, now, pass_, limit_node):
                    return None
            return reason
    if sched.tree.user_limits:
        claimants = (sched.jobs[owner] for owner in sched._claims)
        block = user_block(job, sched.tree, sched.ledger.by_user, claimants)
        if block is not None:
            return block
    if job.gpus == 0:  # CPU-only: one node with the CPUs and memory (see .resources)
        if reservation is not None and may_backfill(reservation, sched._walltime(job), now):
            reservation = None
        exclude = sched.admin.maintenance_excluded(job, now)
        return place_cpu_only_or_reason(
            sched.state, job, exclude, reservation, sched.jobs, pass_.reasons
        )
    free = sched.state.free_for(job)
    if free < job.amount - 1e-9:
        return reasons.GPUS_BUSY.reason(gpus=job.amount, free=free)
    exclude = sched.admin.maintenance_excluded(job, now)
    if reservation is not None and not may_backfill(reservation, sched._walltime(job), now):
        exclude = exclude | reservation.nodes
    patient = sched._patient(job, now)
    shape = (
        job.gpus <= sched.cluster.max_node_gpus,
        job.gpu_fraction,
        job.gpus_per_node,
        job.gpu_models,
        tuple(sorted(job.labels.items())),
        job.cpus,
        job.memory_gb,
        bool(exclude),
        patient,
        sched.admin.maintenance_excluded(job, now),
    )
    if job.amount >= pass_.failed.get(shape, math.inf):
        reason = pass_.reasons[shape]  # a smaller job of this shape did not fit either
        if reason.detail == "reservation" and not any(sched.state.free[n] for n in exclude):
            return shape_reason(sched.cluster, job, free)  # the reserved GPUs were taken since
        return reason
    topology = sched.policy.topology
    placement = find_placement(
        sched.state, job, topology=topology, exclude=exclude, one_leaf=patient
    )
    if placement is not None:
        return placement
    if patient and find_placement(sched.state, job, exclude=exclude) is not None:
        if job.one_leaf_since is None:  # its patience runs from now
            job.one_leaf_since = now
        sched.agenda.wake_at(job.one_leaf_since + sched.settings.leaf_patience)
        patience = sched.settings.leaf_patience / 60
        reason = reasons.ONE_LEAF.reason(free=free, patience_min=patience)
        pass_.failed[shape], pass_.reasons[shape] = job.amount, reason
        return reason
    maintenance = sched.admin.maintenance_excluded(job, now)
    if maintenance and find_placement(sched.state, job, exclude=exclude - maintenance):
        reason = reasons.MAINTENANCE.reason(walltime_h=sched._walltime(job) / 3600)
    elif reservation is not None and exclude and any(sched.state.free[n] for n in exclude):
        reason = reasons.RESERVATION.reason(job=reservation.job_id)
    else:
        reason = shape_reason(sched.cluster, job, free)
    pass_.failed[shape] = job.amount
    pass_.reasons[shape] = reason
    return reason


def patient_for_one_leaf(policy, cluster, settings, leaf_gpus: float, job: Job, now: float) -> bool:
    """A gang that fits one leaf switch waits a while for one before it spans leaves: for
    ``leaf_patience`` from the first pass that could have placed it across leaves (time
    spent waiting for GPUs at all does not use its patience up)."""
    return (
        policy.topology
        and policy.leaf_patience
        and len(cluster.leaves) > 1
        and cluster.max_node_gpus < job.gpus <= leaf_gpus
        and (job.one_leaf_since is None or now < job.one_leaf_since + settings.leaf_patience)
    )
