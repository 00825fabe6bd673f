"""The lists a deep pass leaves out: behind the reservation, a list none of whose jobs can
start is not examined job by job.

A deep pass walks the pending jobs in priority order. Behind the reservation most of them
cannot start: they would outlast it, or the reserved nodes have no GPU free, so they must fit
outside the reserved nodes, and nothing there fits them. Examining each costs the quota test,
the capacity test and a placement search, and gives the answer of the pass before.
:func:`list_cannot_start` tells, from what a list's jobs ask (:class:`~.ordering.ListShapes`)
and from the free GPUs outside the reservation, that no job of the list can start, pre-empt,
or be refused a placement; the pass then leaves the list out (:func:`leave_out`).

What a left-out list still does in the pass is give its jobs their reasons and count against
``backfill.depth``, where the full walk would have reached it: a job that asks for more GPUs
than are free, one of a shape refused a placement earlier in the pass, any job once the
reserved nodes are full, counts. Before the pass examines its next job, :func:`count_blocked`
walks the left-out lists up to that job, in priority order over them (no placement search: the
reason a job of its shape got, or the reservation, or its shape), so the pass stops at the job
it would have stopped at. The decisions, and the reasons, are those of examining every job;
``tests/test_incremental_pass.py`` runs both and compares every decision and every pending
job's reason after every pass.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

from . import reasons
from .admission import headroom, policy_block, user_block
from .arrays import array_block
from .jobs import Job
from .placement import shape_reason
from .reservation import may_backfill


@dataclass
class LeftOut:
    """A list the pass left out; its jobs before ``position`` were walked (see
    :func:`count_blocked`). ``done``: the rest is skipped, as the full walk skips a list whose
    quota room is smaller than its smallest job."""

    items: list  # the pending queue's own list: (submit time, job id) in priority order
    position: int
    done: bool = False

    def head(self) -> str | None:
        return (
            None if self.done or self.position >= len(self.items) else self.items[self.position][1]
        )


class LeftOutLists(dict):
    """The lists a pass left out (list key -> :class:`LeftOut`), and when each is due: the
    priority key of its next job to walk (so a walk looks only at the lists it reaches)."""

    def __init__(self):
        super().__init__()
        self.next: list[tuple[tuple, tuple]] = []  # heap of (key of its next job, list key)

    def add(self, list_key: tuple, left: LeftOut, next_key: tuple) -> None:
        self[list_key] = left
        heapq.heappush(self.next, (next_key, list_key))

    def due(self, before: tuple | None) -> list[tuple[tuple, LeftOut]]:
        """Take out the lists whose next job comes before ``before`` (None: all)."""
        out = []
        while self.next and (before is None or self.next[0][0] < before):
            _, list_key = heapq.heappop(self.next)
            out.append((list_key, self[list_key]))
        return out


def list_cannot_start(sched, pass_, job: Job, now: float) -> bool:
    """True when no job of ``job``'s list (which comes after the reservation) can start,
    pre-empt, or wait on placement in the rest of this pass.

    It holds when the list has only whole-GPU jobs that take any GPU model; none pre-empts
    (tier 3, or no tries left); none fits outside the reserved nodes (k GPUs on each of n nodes
    needs n nodes with k free; a gang spread as it fits needs that many free in all); no
    maintenance is planned; and either each job would outlast the reservation, so it must keep
    off the reserved nodes, or the reserved nodes have no GPU free (then even a job short
    enough to backfill has nowhere else to go). Each of its jobs then waits on policy, on
    capacity (more GPUs asked than are free), on the reservation, or on its shape (the reason a
    job of its shape got earlier in the pass; :func:`count_blocked` counts those that count)."""
    shapes = sched.pending.shapes.get(sched.pending.list_of(job))
    if shapes is None or shapes.other:
        return False
    if pass_.tries > 0 and not (job.tier == 3 and sched.tier_first):
        return False
    if pass_.tries > 0 and job.id in sched.priorities.urgent:
        return False  # an urgent job of tier 3 may pre-empt (core/deadlines.py)
    reservation = sched.reservation
    if reservation is None or reservation.start is None or sched.maintenance:
        return False
    nodes_with_at_least, outside_total, reserved_free = around_reservation(sched, pass_)
    if reserved_free and now + shapes.by_run_time[0][0] <= reservation.start:
        return False  # its shortest job would end before the reservation starts: it may backfill
        # on the reserved nodes' free GPUs (with none free there, it too must fit outside)
    for per_node, nodes in shapes.on_nodes:
        if nodes_with_at_least[per_node] >= nodes:
            return False
    return not (shapes.spanning and min(shapes.spanning) <= outside_total)


def around_reservation(sched, pass_) -> tuple[list[int], int, int]:
    """:func:`outside_reservation` for the reservation in force, computed once per change of
    the cluster state within a pass (``pass_.outside``)."""
    state, reservation = sched.state, sched.reservation
    cached = pass_.outside
    if cached is None or cached[0] is not reservation or cached[1] != state.version:
        view = outside_reservation(state, reservation.nodes)
        cached = pass_.outside = (reservation, state.version, view)
    return cached[2]


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


def leave_out(sched, pass_, job: Job) -> None:
    """Leave ``job``'s list out from ``job`` on (the pass's iterator skips the rest)."""
    list_key = sched.pending.list_of(job)
    items = sched.pending.lists[list_key]
    position = bisect_left(items, (job.submit_time, job.id))
    pass_.left_out.add(list_key, LeftOut(items, position), sched._key(job.id))


def first_head(sched, left_out: dict) -> Job | None:
    """The next job to walk of some left-out list (they are alike for :func:`nothing_usable`:
    tier 3, or no pre-emption tries left)."""
    for left in left_out.values():
        head = left.head()
        if head is not None:
            return sched.jobs[head]
    return None


def count_blocked(sched, pass_, before: tuple | None) -> None:
    """Walk the left-out lists up to the job of priority key ``before`` (None: to their ends),
    in priority order over all of them, as the full walk would: give each job the reason it
    would give, and count against ``backfill.depth`` each one blocked on capacity or
    placement; the walk ends at the job that reaches the depth (the full walk stops there)."""
    depth = sched.settings.backfill_depth
    if pass_.blocked >= depth:
        return
    due = pass_.left_out.due(before)
    if not due:
        return
    key = sched._key
    by_key = lambda entry: key(entry[1])  # noqa: E731 (a list is in priority order)
    walks, ranges = _ranges(sched, due, before, by_key, pass_.swept or ())
    if len(ranges) > 1:  # in priority order over the lists (a list is in priority order)
        in_order = (
            entry for _, entry in heapq.merge(*([(key(e[0]), e) for e in r] for r in ranges))
        )
    else:
        in_order = ranges[0] if ranges else ()
    reason_of = WalkReasons(sched, pass_) if ranges else None
    cut = None
    for job_id, queue, index in in_order:
        job = sched.jobs[job_id]
        reason = reason_of(job, queue, index)
        sched._set_reason(job, reason)
        if reason.family != "policy":
            pass_.blocked += 1
            if pass_.blocked >= depth:
                cut = key(job_id)  # the walk ends after this job
                break
    for list_key, left, stop, done_at in walks:
        if cut is not None:
            stop = min(stop, bisect_right(left.items, cut, lo=left.position, key=by_key))
        left.position = stop
        left.done = done_at is not None and (cut is None or done_at <= cut)
        if not left.done and stop < len(left.items):
            pass_.left_out.add(list_key, left, key(left.items[stop][1]))


def _ranges(sched, due: list, before: tuple | None, by_key, swept) -> tuple:
    """For each due list: (list key, its LeftOut, where its walk ends, the key of the job it
    ends on if the rest is skipped), and the jobs it walks, [(job id, its queue, the list's
    index)] (jobs waiting for their victims, and jobs the pass's shortest-first sweep started,
    are passed by)."""
    jobs, claims, quotas = sched.jobs, sched._claims, sched.policy.quotas
    walks, ranges = [], []
    for list_key, left in due:
        items = left.items
        stop = (
            len(items)
            if before is None
            else bisect_left(items, before, lo=left.position, key=by_key)
        )
        first = left.position
        while first < stop and (items[first][1] in claims or items[first][1] in swept):
            first += 1
        if first >= stop:
            walks.append((list_key, left, stop, None))
            continue
        head = jobs[items[first][1]]
        queue = sched.tree.get(head.queue) if quotas else sched.tree.root
        index = len(walks)
        if quotas:  # (the quotas do not change while the pass walks these jobs)
            room = headroom(head, queue, sched.policy.guarantees)
            if room < sched.pending.smallest_in(sched.pending.list_of(head)) - 1e-9:
                # it waits on policy, and so does the rest of its list (the full walk skips it)
                walks.append((list_key, left, first + 1, by_key(items[first])))
                ranges.append([(head.id, queue, index)])
                continue
        walks.append((list_key, left, stop, None))
        ranges.append(
            [
                (job_id, queue, index)
                for _, job_id in items[first:stop]
                if job_id not in claims and job_id not in swept
            ]
        )
    return walks, ranges


class WalkReasons:
    """The reason :func:`.passes.evaluate` would give a job of a left-out list, in one walk of
    :func:`count_blocked` (nothing it reads changes during the walk but the pass's shapes)."""

    def __init__(self, sched, pass_):
        self.sched, self.pass_ = sched, pass_
        self.free = sched.state.free_total
        self.claimants = [sched.jobs[owner] for owner in sched._claims]
        self.by_user = bool(sched.tree.user_limits)
        # a job's policy reason depends, here, only on its list (queue and tier), its array,
        # its user where users have limits, and what it asks for: one test for each such kind
        self.policy: dict = {}
        self.busy: dict = {}  # GPUs asked -> the capacity reason (the same for each such job)
        # (what it asks, whether it may backfill, the shapes' version) -> reason_behind's
        self.behind: dict = {}

    def __call__(self, job: Job, queue, list_index: int):
        sched, free = self.sched, self.free
        asks = (job.gpus, job.request_shape)
        array = (job.array_id, job.array_max_running) if job.array_id is not None else None
        kind = (list_index, array, job.user if self.by_user else None, asks)
        reason = self.policy.get(kind, False)
        if reason is False:
            reason = self.policy[kind] = policy_reason(sched, job, queue, self.claimants)
        if reason is not None:
            return reason
        amount = job.amount
        if free < amount - 1e-9:
            reason = self.busy.get(amount)
            if reason is None:
                reason = self.busy[amount] = reasons.GPUS_BUSY.reason(gpus=amount, free=free)
            return reason
        shapes = self.pass_.shapes
        backfills = may_backfill(sched.reservation, sched._walltime(job), self.pass_.now)
        reason = self.behind.get((asks, backfills, shapes.version))
        if reason is None:
            reason = reason_behind(sched, self.pass_, job, free, backfills)
            self.behind[asks, backfills, shapes.version] = reason  # (as the shapes hold it now)
        return reason


def policy_reason(sched, job: Job, queue, claimants: list):
    """The first three steps of :func:`.passes.evaluate`: the reason its job array's
    ``%max_running``, the quotas or the user limits give (``claimants``: the jobs holding
    pre-emption claims), or None."""
    if job.array_id is not None:
        reason = array_block(job, sched.ledger.by_array, claimants)
        if reason is not None:
            return reason
    if sched.policy.quotas:
        block = policy_block(job, queue, sched.policy.guarantees)
        if block is not None:
            return block[0]
    if sched.tree.user_limits:
        return user_block(job, sched.tree, sched.ledger.by_user, claimants)
    return None


def reason_behind(sched, pass_, job: Job, free: float, backfills: bool):
    """The reason :func:`.passes.evaluate` gives a job of a left-out list that GPUs enough are
    free for: it fits nowhere outside the reserved nodes (:func:`list_cannot_start`, and since
    then GPUs were only taken), so it is the reason cached for its shape, else the reservation
    if the reserved nodes have GPUs free, else its shape (and that reason is cached, as
    ``evaluate`` caches it). ``backfills``: it would end before the reservation starts (then it
    need not keep off the reserved nodes, which have no GPU free)."""
    reservation = sched.reservation
    exclude = frozenset() if backfills else reservation.nodes
    patient = sched._patient(job, now=pass_.now, behind=True)
    shape = pass_.shapes.shape(sched, job, exclude, patient, frozenset())
    reason = pass_.shapes.reason_for(sched, job, shape, exclude, free)
    if reason is None:
        if exclude and any(sched.state.free[n] for n in exclude):
            reason = reasons.RESERVATION.reason(job=reservation.job_id)
        else:
            reason = shape_reason(sched.cluster, job, free)
        pass_.shapes.remember(shape, job.amount, reason)
    return reason
