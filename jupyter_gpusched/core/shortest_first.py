"""Shortest-first backfill: once a deep pass has set the reservation, it first starts, among
the jobs behind it, those that can start now, the shortest planned run time first; then it walks
the jobs behind the reservation in priority order as before (:mod:`.passes`).

EASY backfill in priority order gives a free hole to the first job behind the reservation that
fits it. Given to the shortest job that fits, the same hole serves more jobs sooner, and frees
sooner for the next (SJBF: Tsafrir, Etsion and Feitelson, 2007, "Backfilling using
system-generated predictions rather than user runtime estimates"). The reservation is as safe as
before: each job is tested as the priority walk tests it (:func:`.passes.evaluate`, with the
reservation), so one that would outlast the reservation still keeps off the reserved nodes. What
changes is who of the jobs behind the reservation gets the holes first.

- Within a tier: tier 2 is served before tier 3 (a tier-3 job started first would be the first
  pre-empted for it), then by planned run time, shortest first, then in priority order.
- The sweep pre-empts nobody (pre-emption stays in priority order, in the walk after it) and
  gives no reasons: a job it does not start is examined again by the priority walk, or keeps its
  reason (as any job a pass does not reach).
- It ends when nothing free is of use to any pending job, or after ``backfill.depth`` jobs it
  could not start. A list none of whose jobs can start (:func:`.left_out.list_cannot_start`), or
  whose quota has no room for its smallest job, is dropped from the sweep at its first job.
- ``backfill.order: priority`` turns it off; the ``slurm`` baseline never does it (Slurm's
  backfill tests jobs in priority order).
"""

from __future__ import annotations

import heapq

from .admission import headroom
from .left_out import list_cannot_start
from .state import Placement


def shortest_first_due(sched) -> bool:
    """Whether a deep pass sweeps the jobs behind the reservation shortest first."""
    return (
        sched.policy.backfill
        and sched.policy.shortest_first
        and sched.settings.backfill_order == "shortest"
    )


def sweep(sched, pass_, now: float, skip: set, evaluate, nothing_usable) -> None:
    """Start the jobs behind the reservation that can start now, shortest first within each
    tier (see the module's text); ``skip``: the pass's lists with no room under their quota.
    The jobs it starts go into ``pass_.started`` and ``pass_.swept``. ``evaluate`` and
    ``nothing_usable`` are the pass's own tests (:mod:`.passes`, which calls this)."""
    pending, key, jobs, claims = sched.pending, sched._key, sched.jobs, sched._claims
    holder_tier = jobs[sched.reservation.job_id].tier
    reserved_key = pass_.reserved_key
    grouped = sched.tier_first  # tiers are strict in the priority order: group by tier

    # the heap holds each list's next job: ((tier or 0, planned run time, priority key), list,
    # position, its (run time, submit, id) entries)
    heap = []
    for list_key, shapes in pending.shapes.items():
        if list_key in skip or (grouped and list_key[1] < holder_tier):
            continue  # (a tier above the holder's is all ahead of the reservation)
        by_run_time = shapes.by_run_time
        walltime, _submit, job_id = by_run_time[0]
        group = list_key[1] if grouped else 0
        heap.append(((group, walltime, key(job_id)), list_key, 0, by_run_time))
    heapq.heapify(heap)
    tries, pass_.tries = pass_.tries, 0  # the sweep pre-empts nobody
    misses, depth = 0, sched.settings.backfill_depth
    state = sched.state
    # what only a start changes: whether anything free is usable (with no pre-emption tries it
    # does not depend on the job), the GPUs free, and the lists found able to start
    usable, free, may_start = None, 0.0, set()
    try:
        while heap and misses < depth:
            order, list_key, position, by_run_time = heap[0]
            job_id = by_run_time[position][2]
            dropped = False
            job = jobs[job_id]
            if order[2] > reserved_key and job_id not in claims:
                if usable is None:
                    usable = not nothing_usable(sched, pass_, job, now)
                    free = state.free_total + state.shared_room_total
                if not usable:
                    break
                if job.amount > free + 1e-9:
                    misses += 1  # more GPUs than are free: it waits on capacity
                elif list_key not in may_start and list_cannot_start(sched, pass_, job, now):
                    dropped = True
                else:
                    may_start.add(list_key)
                    outcome = evaluate(sched, job, now, sched.reservation, pass_)
                    if isinstance(outcome, Placement):
                        sched._start(job, outcome, now)
                        pass_.started.append(job)
                        pass_.swept.add(job_id)
                        usable = None
                        may_start.clear()
                    else:
                        misses += 1
                        dropped = _no_room(sched, job, outcome, list_key)
            position += 1
            if dropped or position == len(by_run_time):
                heapq.heappop(heap)
            else:  # the list's next job takes its place
                walltime, _submit, job_id = by_run_time[position]
                group = order[0]
                heapq.heapreplace(
                    heap, ((group, walltime, key(job_id)), list_key, position, by_run_time)
                )
    finally:
        pass_.tries = tries


def _no_room(sched, job, outcome, list_key) -> bool:
    """True when ``job`` waits on its quota with no room for the smallest job of its list."""
    if outcome is None or outcome.family != "policy" or not sched.policy.quotas:
        return False
    room = headroom(job, sched.tree.get(job.queue), sched.policy.guarantees)
    return room < sched.pending.smallest_in(list_key) - 1e-9
