"""The scheduler: events in, decisions out. Pure: no I/O, no clock (``now`` is passed in).

Adapters call :meth:`Scheduler.submit`, :meth:`~Scheduler.cancel`, :meth:`~Scheduler.job_ended`
and :meth:`~Scheduler.set_node_state` as things happen, then :meth:`~Scheduler.schedule` for the
decisions to carry out (:class:`Start`, :class:`Preempt`, :class:`Stop`).

A scheduling pass walks the pending jobs in priority order (:mod:`.ordering`) and for each one:
1. admit: quotas and tier rules (:mod:`.admission`), else reason ``policy``;
2. capacity: enough free GPUs of the kind asked for, else reason ``capacity``;
3. place: a gang placement (:mod:`.placement`), kept off the reserved nodes unless the job ends
   before the reservation (:mod:`.reservation`), else ``placement`` (or ``policy``/reservation);
4. pre-empt: a blocked job that may pre-empt picks victims (:mod:`.preemption`), which get the
   signal; the GPUs are claimed for it and it starts when its victims have left;
5. reserve: the first job blocked on capacity or placement reserves the GPUs that free soonest.
Only a pass after something was freed walks the whole queue; a pass after submissions only
examines the new jobs (nothing else can have become startable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from . import reasons
from .admin import HELD, AdminSteps
from .admission import (
    Capacity,
    headroom,
    policy_block,
    rejection,
    under_guarantee,
    user_block,
    validate,
)
from .claims import Claim, Holding, PreemptionSteps, holdings
from .cluster import Cluster
from .decisions import Start, Stop
from .errors import ConfigError
from .fragmentation import Fragmentation
from .jobs import Job, JobState, Reason
from .ledger import RunningLedger
from .ordering import PendingQueue
from .placement import find_placement, shape_reason
from .policies import Policy, get_policy
from .preemption import VictimSearch
from .priority import PriorityKeys
from .quotas import QueueTree
from .reservation import Reservation, may_backfill, reserve
from .resources import place_cpu_only_or_reason
from .retries import LaunchRetries
from .settings import PolicySettings
from .state import ClusterState, Placement
from .workload import Workload

PREEMPTION_TRIES_PER_PASS = 8  # successful pre-emptions per pass; the first failure ends them


@dataclass
class _Pass:
    """What one scheduling pass has learnt so far."""

    tries: int  # pre-emption attempts left
    blocked: int = 0
    reserved_key: tuple | None = None
    started: list = field(default_factory=list)
    # smallest request of each shape that did not fit, and why: larger ones need not try
    failed: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)


class Scheduler(PreemptionSteps, AdminSteps):
    def __init__(
        self,
        cluster: Cluster,
        queues: QueueTree | None = None,
        settings: PolicySettings | None = None,
        policy: Policy | str = "gpusched",
    ):
        self.cluster = cluster
        self.state = ClusterState(cluster)
        self.tree = queues or QueueTree.single(cluster.total_gpus)
        self.settings = settings or PolicySettings()
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.half_life = self.tree.half_life or self.settings.fair_share_half_life
        self.jobs: dict[str, Job] = {}
        self.running: dict[str, Job] = {}
        self.ledger = RunningLedger(len(cluster.nodes))  # what the running jobs hold
        self.maintenance: dict[int, float] = {}  # node index -> when it is drained
        self.priorities = PriorityKeys(self.jobs, self.tree, self.settings, self.policy)
        self._key = self.priorities.key
        self.pending = PendingQueue(self._key, by_queue_and_tier=self.policy.order != "arrival")
        self.pending_gpus_by_reason = {"capacity": 0, "placement": 0, "policy": 0}
        self.reservation: Reservation | None = None
        self.passes = 0
        self._claims: dict[str, Claim] = {}
        self._stopping: set[str] = set()
        self.retries = LaunchRetries(self.settings)  # refused launches waiting to be retried
        self._outbox: list = []
        self._new: list[str] = []
        self._freed = False
        self._wake = math.inf  # when a victim passes its minimum run time, or a deep pass is due
        self._last_deep = -math.inf
        self._deep_due = False
        self._capacity = Capacity(cluster)
        self._leaf_gpus = max(
            sum(cluster.nodes[i].gpus for i in members) for members in cluster.leaves.values()
        )
        self._victims = VictimSearch(self.state, self.tree, self.settings, self.policy.topology)
        if self.policy.fragmentation and self.policy.topology and self.settings.fragmentation:
            workload = Workload(cluster.max_node_gpus, self.settings.workload_half_life)
            self.state.fgd = Fragmentation(cluster, workload)

    # -- events ------------------------------------------------------------------------------
    def submit(self, job: Job, now: float) -> Job:
        """Queue ``job`` (or reject it if it can never run here). Raises ConfigError for a
        malformed request and for a duplicate id."""
        validate(job)
        if job.id in self.jobs:
            raise ConfigError(f"a job with id {job.id!r} already exists", field="id")
        if self.policy.quotas and not job.queue and job.user:
            # a trace row without a queue: its user's team queue, as the live service does
            default = self.tree.default_for(job.user)
            if default is not None:
                job.queue = default.path
        reason = rejection(
            job, self._capacity, self.tree, self.policy.quotas, self.policy.guarantees
        )
        self.jobs[job.id] = job
        if reason is not None:
            job.state, job.end_time = JobState.REJECTED, now
            job.reject_reason, job.reject_field = reason
            return job
        if self.policy.quotas:
            job.queue = self.tree.get(job.queue).path
        if self.state.fgd is not None and job.gpus:
            self.state.fgd.workload.observe(job)
        job.state, job.pending_since = JobState.PENDING, now
        if job.held:  # submitted on hold
            self._set_reason(job, HELD)
            return job
        self.pending.add(job, self._walltime(job))
        self._new.append(job.id)
        return job

    def cancel(self, job_id: str, now: float) -> Job:
        job = self.jobs[job_id]
        if job.state == JobState.PENDING:
            self._drop_claim(job)
            self._leave_pending(job)
            job.state, job.end_time, job.held = JobState.CANCELLED, now, False
            self._freed = True  # it may have held the reservation or claimed GPUs
        elif job.state == JobState.RUNNING and job_id not in self._stopping:
            self._stopping.add(job_id)
            self._outbox.append(Stop(job_id, "cancelled"))
        return job

    def job_ended(
        self, job_id: str, now: float, outcome: str = "completed", message: str = ""
    ) -> None:
        """A running job's processes have exited: ``completed``, ``failed``, ``preempted``
        (killed after a pre-emption signal), or ``refused`` (the launcher could not carry out
        the placement; ``message`` says why: see :mod:`.retries`)."""
        if job_id not in self.running:
            return  # already ended (e.g. by a node going down): nothing to do
        job = self.running.pop(job_id)
        self.ledger.ended(job, self.state.release(job_id), self._estimated_end(job))
        self._account(job, -1, now)
        job.end_time = now
        self._freed = True
        claim_owner = job.preempted_by
        job.preempted_by = None
        if job_id in self._stopping:
            self._stopping.discard(job_id)
            job.state = JobState.CANCELLED
        elif outcome == "refused" and job.kind == "batch":
            reason = self.retries.back_off(job, now, message)
            if reason is not None:
                self._set_reason(job, reason)
                self._wake = min(self._wake, job.retry_at)
        elif outcome == "preempted" and job.kind == "batch":
            job.preemptions += 1
            self._requeue(job, reasons.PREEMPTED.reason())
        elif outcome == "preempted":
            job.preemptions += 1
            job.state = JobState.PREEMPTED
        else:
            job.state = JobState.COMPLETED if outcome == "completed" else JobState.FAILED
        if outcome != "refused":
            job.refusals = 0
        if claim_owner is not None:
            self._leaving(job, -1)
            if claim_owner in self._claims:
                self._hand_over(claim_owner, job_id, now)

    def set_node_state(self, name: str, node_state: str, now: float) -> None:
        """``drain``: no new placements, running jobs finish; ``down``: running jobs fail (batch
        jobs are requeued); ``up``: back in service."""
        node = self.cluster.node(name)
        self.state.set_node_state(node.index, node_state)
        if node_state == "up":
            self._freed = True
            return
        for owner, claim in list(self._claims.items()):
            if node.index in claim.placement.nodes:  # no new placement there
                self._drop_claim(self.jobs[owner])
        if node_state != "down":
            return
        for job_id in sorted(self.state.holders[node.index]):
            job = self.running[job_id]
            self._outbox.append(Stop(job_id, f"node {name} is down", ended=True))
            self.job_ended(job_id, now, "failed")
            if job.kind == "batch" and job.state == JobState.FAILED:
                self._requeue(job, reasons.NODE_DOWN.reason(node=name))

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, now: float) -> list:
        """Run a scheduling pass if anything changed; return the decisions to carry out."""
        if now >= self._wake:
            self._wake = math.inf
            self._freed = self._deep_due = True
            if self.maintenance:
                self._start_maintenance(now)
                self._wake = min([self._wake, *self.maintenance.values()])
            if self.retries.backing_off:
                due, later = self.retries.due(now)
                for job in due:
                    self._set_reason(job, None)
                    self.pending.add(job, self._walltime(job))
                    self._new.append(job.id)
                self._wake = min(self._wake, later)
        if self._freed or self._new:
            full, new = self._freed, self._new
            self._freed, self._new = False, []
            self.passes += 1
            if self.priorities.refresh(now, self.half_life):
                self.pending.refresh()
            previous = self.reservation
            if previous is not None and (
                full or self.jobs[previous.job_id].state != JobState.PENDING
            ):
                self.reservation = None
            if full:
                interval = self.settings.backfill_interval
                deep = self._deep_due or now - self._last_deep >= interval
                deep = deep or not self.policy.backfill
                if deep:
                    self._last_deep, self._deep_due = now, False
                skip: set = set()
                stopped = self._pass(self.pending.ordered(skip), now, skip, deep, previous)
                if stopped and len(self.pending) > 1:  # a deep pass will look further
                    self._wake = min(self._wake, self._last_deep + interval)
            # new jobs: all of them after submissions only; after a full pass, the ones it
            # stopped before reaching (so that every pending job has a reason)
            fresh = [j for j in new if j in self.jobs and self._waiting_in_line(self.jobs[j])]
            if full:
                fresh = [j for j in fresh if self.jobs[j].reason is None]
            if fresh:
                self._pass(sorted(fresh, key=self._key), now, None)
        out, self._outbox = self._outbox, []
        return out

    @staticmethod
    def _waiting_in_line(job: Job) -> bool:
        """Pending and neither held nor waiting out a refused launch's back-off."""
        return job.state == JobState.PENDING and not job.held and job.retry_at is None

    def _pass(self, candidates, now, skip=None, deep=True, previous=None) -> bool:
        """Examine ``candidates`` in priority order; True if it stopped at a blocked job.

        Passes after submissions examine just the new jobs. Passes after something was freed
        examine the queue in order: a *quick* pass (like Slurm's main scheduler) stops at the
        first job blocked on capacity or placement; a *deep* one, at most every
        ``backfill.interval`` (and after a minimum run time ends), also backfills behind it and
        tries pre-emption, until ``backfill.depth`` jobs were blocked or nothing usable is
        left. Jobs a pass does not reach keep the reason of their last examination."""
        full = skip is not None
        tries = PREEMPTION_TRIES_PER_PASS if self.policy.preemption and deep else 0
        pass_ = _Pass(tries)
        stopped = False
        if self.reservation is not None:
            pass_.reserved_key = self._key(self.reservation.job_id)
        for job_id in candidates:
            job = self.jobs[job_id]
            if full and self._pass_is_over(pass_, job, now):
                break
            if job_id in self._claims:
                continue
            behind = pass_.reserved_key is not None and self._key(job_id) > pass_.reserved_key
            outcome = self._evaluate(job, now, self.reservation if behind else None, pass_)
            if isinstance(outcome, Placement):
                self._start(job, outcome, now)
                pass_.started.append(job)
                continue
            if outcome is None:  # it pre-empted: the claim holds its GPUs
                continue
            if job.gpus == 0:  # CPU-only: no pre-emption, no reservation, no stop (.resources)
                self._set_reason(job, outcome)
                continue
            if full and outcome.family == "policy" and self.policy.quotas:
                list_key = self.pending.list_of(job)
                room = headroom(job, self.tree.get(job.queue), self.policy.guarantees)
                if room < self.pending.smallest_in(list_key) - 1e-9:
                    skip.add(list_key)  # no job of its list fits under the same quota
            if outcome.family in ("capacity", "placement"):
                if self._try_preempt(job, now, pass_):
                    continue
                pass_.blocked += 1
                if self.policy.backfill and (self.reservation is None or not behind):
                    if deep or previous is None or previous.job_id != job_id:
                        previous = reserve(self.state, job, self.ledger.ends, self.jobs, now)
                    self.reservation = previous  # a quick pass keeps the last one's estimate
                    pass_.reserved_key = self._key(job_id)
                    pass_.failed.clear()  # the reserved nodes changed
                    outcome = outcome.with_eta(self.reservation.start)
                if full and not deep:
                    self._set_reason(job, outcome)
                    stopped = True
                    break
            self._set_reason(job, outcome)
        for job in pass_.started:
            self._leave_pending(job)
        return stopped

    def _pass_is_over(self, pass_: _Pass, job: Job, now: float) -> bool:
        """True when neither ``job`` nor any job after it can start in this pass."""
        if pass_.blocked >= self.settings.backfill_depth:
            return True
        if pass_.tries > 0 and job.tier < 3:
            return False  # it may pre-empt (tiers are strict: after tier 3 only tier 3 comes)
        smallest = self.pending.smallest_request()
        if self.state.free_total + self.state.shared_room_total < smallest - 1e-9:
            return True
        r = self.reservation
        if r is None or r.start is None:
            return False
        outside = self.state.free_total - sum(self.state.free[n] for n in r.nodes)
        # a job that would outlast the reservation must fit outside its nodes
        return outside < smallest and now + self.pending.shortest_walltime() > r.start

    def _evaluate(self, job: Job, now: float, reservation, pass_: _Pass):
        """A placement to start now, the Reason it waits, or None if it pre-empted."""
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        if self.policy.quotas:
            block = policy_block(job, queue, self.policy.guarantees)
            if block is not None:
                reason, limit_node = block
                if limit_node not in (None, queue) and pass_.tries > 0 and self._reclaims(job):
                    self._set_reason(job, reason)
                    if self._try_preempt(job, now, pass_, limit_node):
                        return None
                return reason
        if self.tree.user_limits:
            claimants = (self.jobs[owner] for owner in self._claims)
            block = user_block(job, self.tree, self.ledger.by_user, claimants)
            if block is not None:
                return block
        if job.gpus == 0:  # CPU-only: one node with the CPUs and memory (see .resources)
            if reservation is not None and may_backfill(reservation, self._walltime(job), now):
                reservation = None
            exclude = self._maintenance_excluded(job, now)
            return place_cpu_only_or_reason(
                self.state, job, exclude, reservation, self.jobs, pass_.reasons
            )
        free = self.state.free_for(job)
        if free < job.amount - 1e-9:
            return reasons.GPUS_BUSY.reason(gpus=job.amount, free=free)
        exclude = self._maintenance_excluded(job, now)
        if reservation is not None and not may_backfill(reservation, self._walltime(job), now):
            exclude = exclude | reservation.nodes
        patient = self._patient(job, now)
        shape = (
            job.gpus <= self.cluster.max_node_gpus,
            job.gpu_fraction,
            job.gpus_per_node,
            job.gpu_models,
            tuple(sorted(job.labels.items())),
            job.cpus,
            job.memory_gb,
            bool(exclude),
            patient,
            self._maintenance_excluded(job, now),
        )
        if job.amount >= pass_.failed.get(shape, math.inf):
            return pass_.reasons[shape]  # a smaller job of this shape did not fit either
        topology = self.policy.topology
        placement = find_placement(
            self.state, job, topology=topology, exclude=exclude, one_leaf=patient
        )
        if placement is not None:
            return placement
        if patient and find_placement(self.state, job, exclude=exclude) is not None:
            if job.one_leaf_since is None:  # its patience runs from now
                job.one_leaf_since = now
            self._wake = min(self._wake, job.one_leaf_since + self.settings.leaf_patience)
            patience = self.settings.leaf_patience / 60
            reason = reasons.ONE_LEAF.reason(free=free, patience_min=patience)
            pass_.failed[shape], pass_.reasons[shape] = job.amount, reason
            return reason
        maintenance = self._maintenance_excluded(job, now)
        if maintenance and find_placement(self.state, job, exclude=exclude - maintenance):
            reason = reasons.MAINTENANCE.reason(walltime_h=self._walltime(job) / 3600)
        elif reservation is not None and exclude and any(self.state.free[n] for n in exclude):
            reason = reasons.RESERVATION.reason(job=reservation.job_id)
        else:
            reason = shape_reason(self.cluster, job, free)
        pass_.failed[shape] = job.amount
        pass_.reasons[shape] = reason
        return reason

    def _patient(self, job: Job, now: float) -> bool:
        """A gang that fits one leaf switch waits a while for one before it spans leaves: for
        ``leaf_patience`` from the first pass that could have placed it across leaves (time
        spent waiting for GPUs at all does not use its patience up)."""
        return (
            self.policy.topology
            and self.policy.leaf_patience
            and len(self.cluster.leaves) > 1
            and self.cluster.max_node_gpus < job.gpus <= self._leaf_gpus
            and (
                job.one_leaf_since is None or now < job.one_leaf_since + self.settings.leaf_patience
            )
        )

    # -- bookkeeping -------------------------------------------------------------------------
    def _start(self, job: Job, placement: Placement, now: float, restored=False) -> None:
        """Give ``placement`` to ``job``; ``restored``: it already runs there (see
        :meth:`restore`), so keep its run count and start time and emit no Start."""
        self.state.take(job.id, placement)
        self._set_reason(job, None)
        if not restored:
            job.start_time, job.runs = now, job.runs + 1
        job.state = JobState.RUNNING
        if job.first_start is None:
            job.first_start = job.start_time
        self.running[job.id] = job
        minimum = self.settings.tiers[job.tier].minimum_run_time if job.tier > 1 else 0
        protected = minimum > 0 and job.start_time + minimum > now
        self.ledger.started(job, placement, self._estimated_end(job), protected)
        self._account(job, +1, now)
        if not restored:
            self._outbox.append(Start(job.id, placement))

    def _requeue(self, job: Job, reason: Reason) -> None:
        job.state = JobState.PENDING
        job.pending_since = job.end_time
        job.one_leaf_since = None
        self.pending.add(job, self._walltime(job))
        self._set_reason(job, reason)

    def _leave_pending(self, job: Job) -> None:
        self.pending.remove(job, self._walltime(job))
        self._set_reason(job, None)

    def _account(self, job: Job, sign: int, now: float) -> None:
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        cpus, memory = sign * (job.cpus or 0.0), sign * (job.memory_gb or 0.0)
        self.tree.account(queue, sign * job.amount, now, self.half_life, cpus, memory)
        if job.tier == 1 and job.id not in self._claims:
            queue.tier1_running += sign * job.amount

    def _set_reason(self, job: Job, reason: Reason | None) -> None:
        if job.reason is not None:
            self.pending_gpus_by_reason[job.reason.family] -= job.amount
        job.reason = reason
        if reason is not None:
            self.pending_gpus_by_reason[reason.family] += job.amount
            if job.first_reason is None and job.runs == 0:
                job.first_reason = reason

    def _walltime(self, job: Job) -> float:
        return job.walltime or self.settings.default_walltime(job.kind)

    def _estimated_end(self, job: Job) -> float:
        return job.start_time + self._walltime(job)

    def _reclaims(self, job: Job) -> bool:
        """May ``job`` take back borrowed GPUs (pre-empt tier 2 of other queues)? Only while its
        queue, and every ancestor, stays within its guarantee (invariant 4)."""
        return self.policy.guarantees and under_guarantee(job, self.tree.get(job.queue))

    def next_wakeup(self) -> float | None:
        """When the adapter should call :meth:`schedule` even if nothing happens: a pre-emption
        victim passes its minimum run time then."""
        return None if self._wake == math.inf else self._wake

    def holdings(self, node: int) -> list[Holding]:
        """Who holds what on node ``node`` (an index): running jobs and pre-emption claims."""
        return holdings(self.state, node)

    def retrying_jobs(self) -> list[Job]:
        """Pending jobs waiting out a back-off after a refused launch (see :mod:`.retries`)."""
        return self.retries.waiting()

    def pending_jobs(self, now: float) -> list[Job]:
        """Pending jobs in priority order."""
        return [self.jobs[j] for j in self.pending.ordered()]
