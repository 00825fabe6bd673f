"""One scheduling pass: the pending jobs it is given, examined in priority order (see the steps
in :mod:`.scheduler`): each is started, pre-empts, reserves the GPUs that free soonest or keeps
the reason it waits.

Apart from :mod:`.scheduler`, which turns events into state and decides when a pass runs and
over which jobs; a pass reads and changes that state (``sched``: the
:class:`~.scheduler.Scheduler`), and leaves pre-emption to its :class:`~.claims.Preemptions`
and maintenance windows to its :class:`~.admin.Admin`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import reasons
from .admission import headroom, policy_block, user_block
from .arrays import array_block
from .jobs import Job
from .left_out import (
    LeftOutLists,
    around_reservation,
    count_blocked,
    first_head,
    leave_out,
    list_cannot_start,
)
from .one_leaf import hold_one_leaf
from .placement import find_placement, placement_exists, shape_reason
from .reservation import may_backfill, reserve
from .resources import place_cpu_only_or_reason
from .shapes import ShapeCache
from .shortest_first import shortest_first_due, sweep
from .state import Placement

PREEMPTION_TRIES_PER_PASS = 8  # successful pre-emptions per pass; the first failure ends them


@dataclass
class Pass:
    """What one scheduling pass has learnt so far."""

    tries: int  # pre-emption attempts left
    now: float
    blocked: int = 0  # jobs blocked on capacity or placement (a deep pass stops at backfill.depth)
    reserved_key: tuple | None = None
    started: list = field(default_factory=list)
    shapes: ShapeCache = field(default_factory=ShapeCache)  # GPU shapes that did not fit
    cpu_only_reasons: dict = field(default_factory=dict)  # the same for CPU-only requests
    # lists left out behind the reservation (.left_out), and the free GPUs around the
    # reservation that their test and nothing_usable read, kept while the cluster state does
    # not change: (reservation, state version, .left_out.outside_reservation's view)
    left_out: LeftOutLists = field(default_factory=LeftOutLists)
    outside: tuple | None = None
    capped_arrays: dict = field(default_factory=dict)  # array id -> its array-limit reason
    swept: set | None = None  # jobs started shortest first behind the reservation (None: no
    # sweep yet in this pass; .shortest_first)
    holder: tuple | None = None  # (the job that took the reservation, starts before it)


def run_pass(sched, candidates, now, skip=None, deep=True, previous=None) -> bool:
    """Examine ``candidates`` in priority order; True if it stopped at a blocked job.

    Passes after submissions examine just the new jobs. Passes after something was freed
    examine the queue in order: a *quick* pass (like Slurm's main scheduler) stops at the
    first job blocked on capacity or placement; a *deep* one, at most every
    ``backfill.interval`` (and after a minimum run time ends), also backfills behind it (the
    shortest jobs first: :mod:`.shortest_first`) and tries pre-emption, until
    ``backfill.depth`` jobs were blocked or nothing usable is left. Jobs a pass does not
    reach keep the reason of their last examination (the lists a deep pass leaves out:
    :mod:`.left_out`)."""
    full = skip is not None
    tries = PREEMPTION_TRIES_PER_PASS if sched.policy.preemption and deep else 0
    pass_ = Pass(tries, now)
    stopped = False
    if sched.reservation is not None:
        pass_.reserved_key = sched._key(sched.reservation.job_id)
    left_out = pass_.left_out
    sweeps = full and deep and shortest_first_due(sched)
    for job_id in candidates:
        if pass_.swept and job_id in pass_.swept:
            continue  # started by the sweep (still in the pending lists until the pass ends)
        job = sched.jobs[job_id]
        key = sched._key(job_id)
        if full:  # the pass is over when neither this job nor any after it can start
            # (once the first blocked job holds the reservation: a new job must not take it)
            settled = sched.reservation is not None or not sched.policy.backfill
            if settled and nothing_usable(sched, pass_, job, now):
                break
            if left_out.next and left_out.next[0][0] < key:  # left-out jobs come before it
                count_blocked(sched, pass_, key)
            if pass_.blocked >= sched.settings.backfill_depth:
                break
        behind = pass_.reserved_key is not None and key > pass_.reserved_key
        if job_id in sched._claims:
            # its victims are leaving; GPUs freed elsewhere meanwhile may start it sooner
            placement = None if behind else placement_elsewhere(sched, job, now)
            if placement is not None:
                sched.preemptions.started_elsewhere(job)
                sched._start(job, placement, now)
                pass_.started.append(job)
            continue
        if behind and full and sched.leave_out_lists and list_cannot_start(sched, pass_, job, now):
            leave_out(sched, pass_, job)
            skip.add(sched.pending.list_of(job))
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
            if sched.preemptions.try_preempt(job, now, pass_, behind=behind):
                continue
            pass_.blocked += 1
            if sched.policy.backfill and (sched.reservation is None or not behind):
                if deep or previous is None or previous.job_id != job_id:
                    within = (
                        sched.settings.leaf_reservation_slack if sched._fits_one_leaf(job) else None
                    )
                    ends = sched.ledger.ends  # (the running jobs' limits: .runtime_estimates)
                    previous = reserve(sched.state, job, ends, sched.jobs, now, within)
                    hold_one_leaf(sched.cluster, job, previous, within)
                sched.reservation = previous  # a quick pass keeps the last one's estimate
                pass_.reserved_key = key
                pass_.holder = (job, len(pass_.started))
                pass_.shapes.clear()  # the reserved nodes changed
                outcome = outcome.with_eta(sched.reservation.start)
            if full and not deep:
                sched._set_reason(job, outcome)
                stopped = True
                break
        sched._set_reason(job, outcome)
        if sweeps and pass_.swept is None and sched.reservation is not None:
            pass_.swept = set()
            sweep(sched, pass_, now, skip, evaluate, nothing_usable)
    else:
        # the full walk would go on over the rest of the left-out lists (to give their jobs
        # its reasons): the pass ended with nothing of theirs able to start
        head = first_head(sched, left_out)
        if head is not None and not nothing_usable(sched, pass_, head, now):
            count_blocked(sched, pass_, None)
    if full:
        holder_reason_after_backfill(sched, pass_)
    for job in pass_.started:
        sched._leave_pending(job)
    if full:
        sched.lists_left_out += len(left_out)
    return stopped


def holder_reason_after_backfill(sched, pass_: Pass) -> None:
    """The reservation's holder was given its reason before the jobs behind it started: once
    some did and it now asks more GPUs than are free, its capacity or placement reason becomes
    "needs N GPUs; M free" with the GPUs the pass leaves free (it said "2 free" while backfilled
    jobs held those 2), with the same ETA."""
    if pass_.holder is None or sched.reservation is None:
        return
    holder, starts_before = pass_.holder
    if len(pass_.started) == starts_before or holder.id != sched.reservation.job_id:
        return
    if holder.reason is None or holder.reason.family not in ("capacity", "placement"):
        return
    free = sched.state.free_for(holder)
    if free < holder.amount - 1e-9:
        reason = reasons.GPUS_BUSY.reason(gpus=holder.amount, free=free)
        sched._set_reason(holder, reason.with_eta(sched.reservation.start))


def placement_elsewhere(sched, job: Job, now: float) -> Placement | None:
    """Where ``job``, whose pre-emption victims are still leaving, can start now on free GPUs
    outside its claim (None: nowhere)."""
    exclude = sched.admin.maintenance_excluded(job, now)
    patient = sched._patient(job, now, behind=False)
    topology = sched.policy.topology
    return find_placement(sched.state, job, topology=topology, exclude=exclude, one_leaf=patient)


def nothing_usable(sched, pass_: Pass, job: Job, now: float) -> bool:
    """True when what is free is of no use to ``job`` or to any job after it."""
    if pass_.tries > 0 and (job.tier < 3 or job.id in sched.priorities.urgent):
        return False  # it may pre-empt (tiers are strict: after tier 3 only tier 3 comes, and
        # an urgent tier-3 job, which may pre-empt, before the others: core/deadlines.py)
    smallest = sched.pending.smallest_request()
    if sched.state.free_total + sched.state.shared_room_total < smallest - 1e-9:
        return True
    r = sched.reservation
    if r is None or r.start is None:
        return False
    outside = sched.state.free_total - around_reservation(sched, pass_)[2]
    # a job that would outlast the reservation must fit outside its nodes
    return outside < smallest and now + sched.pending.shortest_walltime() > r.start


def evaluate(sched, job: Job, now: float, reservation, pass_: Pass):
    """A placement to start now, the Reason it waits, or None if it pre-empted."""
    if job.array_max_running is not None:
        # an array at its cap stays at it for the rest of the pass (jobs only start in one):
        # its other elements, maybe thousands, get the same reason without counting again, and
        # first, before the quotas' sums
        block = pass_.capped_arrays.get(job.array_id)
        if block is None:
            claimants = (sched.jobs[owner] for owner in sched._claims)
            block = array_block(job, sched.ledger.by_array, claimants)
        if block is not None:
            pass_.capped_arrays[job.array_id] = block
            return block
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
                behind = reservation is not None
                if sched.preemptions.try_preempt(job, now, pass_, limit_node, behind):
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
            sched.state, job, exclude, reservation, sched.jobs, pass_.cpu_only_reasons
        )
    free = sched.state.free_for(job)
    if free < job.amount - 1e-9:
        return reasons.GPUS_BUSY.reason(gpus=job.amount, free=free)
    maintenance = exclude = sched.admin.maintenance_excluded(job, now)
    if reservation is not None and not may_backfill(reservation, sched._walltime(job), now):
        exclude = exclude | reservation.nodes
    patient = sched._patient(job, now, behind=reservation is not None)
    shape = pass_.shapes.shape(sched, job, exclude, patient, maintenance)
    reason = pass_.shapes.reason_for(sched, job, shape, exclude, free)
    if reason is not None:
        return reason  # a smaller job of this shape did not fit either
    topology = sched.policy.topology
    placement = find_placement(
        sched.state, job, topology=topology, exclude=exclude, one_leaf=patient
    )
    if placement is not None:
        return placement
    if patient and placement_exists(sched.state, job, exclude):
        # its patience runs from now, unless it waits behind the reservation: a gang there is
        # no worse off inside one leaf (it cannot take the reserved nodes either way), and one
        # that spanned leaves there would give up the locality it will reserve at the head
        if job.one_leaf_since is None and reservation is None:
            job.one_leaf_since = now
        if job.one_leaf_since is not None:
            sched.agenda.wake_at(job.one_leaf_since + sched.settings.leaf_patience)
        patience = sched.settings.leaf_patience / 60
        reason = reasons.ONE_LEAF.reason(free=free, patience_min=patience)
        pass_.shapes.remember(shape, job.amount, reason)
        return reason
    if maintenance and placement_exists(sched.state, job, exclude - maintenance):
        reason = reasons.MAINTENANCE.reason(walltime_h=sched._walltime(job) / 3600)
    elif reservation is not None and exclude and any(sched.state.free[n] for n in exclude):
        reason = reasons.RESERVATION.reason(job=reservation.job_id)
    else:
        reason = shape_reason(sched.cluster, job, free)
    pass_.shapes.remember(shape, job.amount, reason)
    return reason
