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
from bisect import bisect_left, insort
from dataclasses import dataclass, field

from .admission import Capacity, policy_block, rejection, under_guarantee, validate
from .cluster import Cluster
from .errors import ConfigError
from .fairshare import fair_share_factors
from .jobs import Job, JobState, Reason
from .ordering import PendingQueue
from .placement import find_placement
from .policies import Policy, get_policy
from .preemption import VictimSearch, find_victims
from .quotas import QueueTree
from .reservation import Reservation, may_backfill, reserve
from .settings import PolicySettings
from .state import ClusterState, Part, Placement

PREEMPTION_TRIES_PER_PASS = 8


@dataclass(frozen=True)
class Start:
    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job_id: str
    by: str  # the job the GPUs go to
    signal: str
    grace: float


@dataclass(frozen=True)
class Stop:
    job_id: str
    reason: str


@dataclass
class Claim:
    """GPUs promised to a pre-empting job: it starts when ``waiting`` is empty."""

    placement: Placement
    waiting: set[str] = field(default_factory=set)


class Scheduler:
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
        self._by_tier: dict[int, dict[str, Job]] = {1: {}, 2: {}, 3: {}}
        self.pending = PendingQueue(by_queue_and_tier=self.policy.order == "priority")
        self.pending_gpus_by_reason = {"capacity": 0, "placement": 0, "policy": 0}
        self.reservation: Reservation | None = None
        self.passes = 0
        self._ends: list[tuple[float, str]] = []  # running jobs by estimated end
        self._claims: dict[str, Claim] = {}
        self._stopping: set[str] = set()
        self._outbox: list = []
        self._new: list[str] = []
        self._freed = False
        self._fair: dict[str, float] = {}
        self._fair_time = -math.inf
        self._wake = math.inf  # when a victim passes its minimum run time
        self._capacity = Capacity(cluster)
        self._victims = VictimSearch(self.state, self.tree, self.settings, self.policy.topology)

    # -- events ------------------------------------------------------------------------------
    def submit(self, job: Job, now: float) -> Job:
        """Queue ``job`` (or reject it if it can never run here). Raises ConfigError for a
        malformed request and for a duplicate id."""
        validate(job)
        if job.id in self.jobs:
            raise ConfigError(f"a job with id {job.id!r} already exists", field="id")
        reason = rejection(job, self._capacity, self.tree, self.policy.quotas)
        self.jobs[job.id] = job
        if reason is not None:
            job.state, job.reject_reason, job.end_time = JobState.REJECTED, reason, now
            return job
        if self.policy.quotas:
            job.queue = self.tree.get(job.queue).path
        job.state = JobState.PENDING
        self.pending.add(job)
        self._new.append(job.id)
        return job

    def cancel(self, job_id: str, now: float) -> Job:
        job = self.jobs[job_id]
        if job.state == JobState.PENDING:
            self._drop_claim(job)
            self._leave_pending(job)
            job.state, job.end_time = JobState.CANCELLED, now
            self._freed = True  # it may have held the reservation or claimed GPUs
        elif job.state == JobState.RUNNING and job_id not in self._stopping:
            self._stopping.add(job_id)
            self._outbox.append(Stop(job_id, "cancelled"))
        return job

    def job_ended(self, job_id: str, now: float, outcome: str = "completed") -> None:
        """A running job's processes have exited: ``completed``, ``failed``, or ``preempted``
        (killed after a pre-emption signal)."""
        job = self.running.pop(job_id)
        del self._by_tier[job.tier][job_id]
        placement = self.state.release(job_id)
        del self._ends[bisect_left(self._ends, (self._estimated_end(job), job_id))]
        self._account(job, -1, now)
        job.end_time = now
        self._freed = True
        claim_owner = job.preempted_by
        job.preempted_by = None
        if job_id in self._stopping:
            self._stopping.discard(job_id)
            job.state = JobState.CANCELLED
        elif (claim_owner is not None or outcome == "preempted") and job.kind == "batch":
            job.preemptions += 1
            self._requeue(job, Reason("capacity", "preempted", "requeued after pre-emption"))
        elif claim_owner is not None or outcome == "preempted":
            job.preemptions += 1
            job.state = JobState.PREEMPTED
        else:
            job.state = JobState.FAILED if outcome == "failed" else JobState.COMPLETED
        if claim_owner is not None and claim_owner in self._claims:
            self._hand_over(claim_owner, job_id, placement, now)

    def set_node_state(self, name: str, node_state: str, now: float) -> None:
        """``drain``: no new placements, running jobs finish; ``down``: running jobs fail (batch
        jobs are requeued); ``up``: back in service."""
        node = self.cluster.node(name)
        self.state.set_node_state(node.index, node_state)
        if node_state == "up":
            self._freed = True
        if node_state != "down":
            return
        for owner, claim in list(self._claims.items()):
            if node.index in claim.placement.nodes:
                self._drop_claim(self.jobs[owner])
        for job_id in sorted(self.state.holders[node.index]):
            job = self.running[job_id]
            self._outbox.append(Stop(job_id, f"node {name} is down"))
            self.job_ended(job_id, now, "failed")
            if job.kind == "batch" and job.state == JobState.FAILED:
                self._requeue(job, Reason("capacity", "node-down", f"requeued: {name} went down"))

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, now: float) -> list:
        """Run a scheduling pass if anything changed; return the decisions to carry out."""
        if now >= self._wake:
            self._wake = math.inf
            self._freed = True
        if self._freed or self._new:
            full, new = self._freed, self._new
            self._freed, self._new = False, []
            self.passes += 1
            self._refresh_fair_share(now)
            if self.reservation is not None and (
                full or self.jobs[self.reservation.job_id].state != JobState.PENDING
            ):
                self.reservation = None
            if full:
                skip: set = set()
                self._pass(self.pending.ordered(lambda j: self._key(j, now), skip), now, skip)
            # new jobs: all of them after submissions only; after a full pass, the ones it
            # stopped before reaching (so that every pending job has a reason)
            fresh = [j for j in new if self.jobs[j].state == JobState.PENDING]
            if full:
                fresh = [j for j in fresh if self.jobs[j].reason is None]
            if fresh:
                self._pass(sorted(fresh, key=lambda j: self._key(j, now)), now, None)
        out, self._outbox = self._outbox, []
        return out

    def _pass(self, candidates, now: float, skip: set | None) -> None:
        """Examine ``candidates`` in order. A full pass (``skip`` given) stops after
        ``backfill.depth`` blocked jobs, or when nothing is free and no pre-emption is left to
        try; jobs it does not reach keep the reason of their last examination."""
        started: list[Job] = []
        blocked = 0
        tries = PREEMPTION_TRIES_PER_PASS if self.policy.preemption else 0
        reserved_key = None
        if self.reservation is not None:
            reserved_key = self._key(self.reservation.job_id, now)
        for job_id in candidates:
            if skip is not None and (
                blocked >= self.settings.backfill_depth
                or (self.state.free_total == 0 and tries <= 0)
            ):
                break
            job = self.jobs[job_id]
            if job_id in self._claims:
                continue
            key = self._key(job_id, now)
            behind = reserved_key is not None and key > reserved_key
            outcome = self._evaluate(job, now, self.reservation if behind else None, tries > 0)
            if isinstance(outcome, Placement):
                self._start(job, outcome, now)
                started.append(job)
                continue
            if isinstance(outcome, bool):  # it tried to reclaim over a queue limit
                tries -= 1
                if outcome:
                    continue
                outcome = job.reason
            if outcome.detail == "queue-limit" and skip is not None:
                skip.add(self.pending.list_of(job))  # the rest of its list is blocked too
            if outcome.family in ("capacity", "placement") and tries > 0:
                attempted = self._preempt(job, now)
                if attempted is not None:
                    tries -= 1
                    if attempted:
                        continue
            if outcome.family != "policy":
                blocked += 1
            if (
                self.policy.backfill
                and outcome.family in ("capacity", "placement")
                and (self.reservation is None or not behind)
            ):
                self.reservation = reserve(self.state, job, self._ends, self.jobs, now)
                reserved_key = key
                outcome = Reason(outcome.family, outcome.detail, outcome.message,
                                 self.reservation.start)  # fmt: skip
            self._set_reason(job, outcome)
        for job in started:
            self.pending.remove(job)

    def _evaluate(self, job: Job, now: float, reservation, may_preempt: bool):
        """A placement to start now, the Reason it waits, or whether its attempt to reclaim
        GPUs over an ancestor's limit succeeded."""
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        if self.policy.quotas:
            block = policy_block(job, queue)
            if block is not None:
                reason, limit_node = block
                self._set_reason(job, reason)
                if may_preempt and limit_node not in (None, queue) and self._reclaims(job):
                    return bool(self._preempt(job, now, limit_node))
                return reason
        free = self._free_for(job)
        if free < job.gpus:
            return Reason("capacity", "gpus-busy", f"needs {job.gpus} GPUs; {free} are free")
        exclude = frozenset()
        walltime = job.walltime or self.settings.default_walltime(job.kind)
        if reservation is not None and not may_backfill(reservation, walltime, now):
            exclude = reservation.nodes
        topology = self.policy.topology
        placement = find_placement(self.state, job, topology=topology, exclude=exclude)
        if placement is not None:
            return placement
        if exclude and find_placement(self.state, job, topology=topology) is not None:
            return Reason(
                "policy",
                "reservation",
                f"the free GPUs it could use are reserved for job {reservation.job_id}, which "
                "has priority; it would not end before that job starts",
            )
        return Reason("placement", *self._placement_message(job, free))

    def _preempt(self, job: Job, now: float, limit_node=None) -> bool | None:
        """Try to pre-empt for ``job``: None if there was nothing to try, else success."""
        if job.tier == 3:
            return None
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        reclaim = self.policy.quotas and self._reclaims(job)
        pool = list(self._by_tier[3].values())
        if reclaim:
            pool.extend(self._by_tier[2].values())
        if sum(j.gpus for j in pool) + self._free_for(job) < job.gpus:
            return None
        found = find_victims(self._victims, job, queue, pool, now, reclaim, limit_node)
        if found is None:
            tiers = self.settings.tiers
            later = [
                j.start_time + tiers[j.tier].minimum_run_time
                for j in pool
                if j.start_time + tiers[j.tier].minimum_run_time > now
            ]
            self._wake = min(self._wake, *later) if later else self._wake
            return False
        placement, victims = found
        claim = Claim(placement, {v.id for v in victims})
        self._claims[job.id] = claim
        held = []
        for part in placement.parts:
            mask = part.mask & self.state.free_mask[part.node]
            if mask:
                held.append(Part(part.node, mask))
        if held:
            self.state.take(_holder(job.id), Placement(tuple(held)))
        self._account_claim(job, +1)
        grace = 0.0
        for victim in victims:
            victim.preempted_by = job.id
            tier_grace = self.settings.tiers[victim.tier].grace_period
            grace = max(grace, tier_grace)
            self._outbox.append(Preempt(victim.id, job.id, self.settings.preemption_signal,
                                        tier_grace))  # fmt: skip
        names = ", ".join(v.id for v in victims)
        self._set_reason(job, Reason("capacity", "preempting",
                                     f"pre-empting {names}; starts once they have checkpointed",
                                     now + grace))  # fmt: skip
        return True

    def _hand_over(self, owner: str, victim_id: str, freed: Placement, now: float) -> None:
        """Give a victim's GPUs that the claim needs to the claim; start the owner when whole."""
        claim = self._claims[owner]
        claim.waiting.discard(victim_id)
        wanted = {p.node: p.mask for p in claim.placement.parts}
        parts = [
            Part(p.node, p.mask & wanted[p.node])
            for p in freed.parts
            if p.mask & wanted.get(p.node, 0)
        ]
        if parts:
            self.state.take(_holder(owner), Placement(tuple(parts)), extend=True)
        if claim.waiting:
            return
        job = self.jobs[owner]
        self._drop_claim(job)
        self._start(job, claim.placement, now)
        self.pending.remove(job)

    # -- bookkeeping -------------------------------------------------------------------------
    def _start(self, job: Job, placement: Placement, now: float) -> None:
        self.state.take(job.id, placement)
        self._set_reason(job, None)
        job.state, job.start_time = JobState.RUNNING, now
        if job.first_start is None:
            job.first_start = now
        job.runs += 1
        self.running[job.id] = job
        self._by_tier[job.tier][job.id] = job
        insort(self._ends, (self._estimated_end(job), job.id))
        self._account(job, +1, now)
        self._outbox.append(Start(job.id, placement))

    def _requeue(self, job: Job, reason: Reason) -> None:
        job.state = JobState.PENDING
        self.pending.add(job)
        self._set_reason(job, reason)

    def _leave_pending(self, job: Job) -> None:
        self.pending.remove(job)
        self._set_reason(job, None)

    def _drop_claim(self, job: Job) -> None:
        claim = self._claims.pop(job.id, None)
        if claim is None:
            return
        if _holder(job.id) in self.state.allocations:
            self.state.release(_holder(job.id))
        self._account_claim(job, -1)
        for victim_id in claim.waiting:
            victim = self.jobs[victim_id]
            if victim.preempted_by == job.id:
                victim.preempted_by = None  # already signalled; it will simply end
        self._freed = True

    def _account(self, job: Job, sign: int, now: float) -> None:
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        self.tree.account(queue, sign * job.gpus, now, self.half_life)
        if job.tier == 1 and job.id not in self._claims:
            queue.tier1_running += sign * job.gpus

    def _account_claim(self, job: Job, sign: int) -> None:
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        self.tree.claim(queue, sign * job.gpus)
        if job.tier == 1:
            queue.tier1_running += sign * job.gpus

    def _set_reason(self, job: Job, reason: Reason | None) -> None:
        if job.reason is not None:
            self.pending_gpus_by_reason[job.reason.family] -= job.gpus
        job.reason = reason
        if reason is not None:
            self.pending_gpus_by_reason[reason.family] += job.gpus
            if job.first_reason is None and job.runs == 0:
                job.first_reason = reason

    def _estimated_end(self, job: Job) -> float:
        return job.start_time + (job.walltime or self.settings.default_walltime(job.kind))

    def _refresh_fair_share(self, now: float) -> None:
        if now - self._fair_time >= self.settings.fair_share_recalc_interval:
            self._fair = fair_share_factors(self.tree, now, self.half_life)
            self._fair_time = now

    def _key(self, job_id: str, now: float) -> tuple:
        job = self.jobs[job_id]
        if self.policy.order == "arrival":
            return (job.submit_time, job_id)
        s = self.settings
        age = min(max(now - job.submit_time, 0.0) / s.max_age, 1.0)
        score = s.fair_share_weight * self._fair.get(job.queue, 1.0) + s.age_weight * age
        return (job.tier, -score, job.submit_time, job_id)

    def _reclaims(self, job: Job) -> bool:
        return job.tier == 1 or under_guarantee(job, self.tree.get(job.queue))

    def _free_for(self, job: Job) -> int:
        if job.gpu_models is None:
            return self.state.free_total
        return sum(f for model, f in self.state.model_free.items() if model in job.gpu_models)

    def _placement_message(self, job: Job, free: int) -> tuple[str, str]:
        if job.gpus_per_node and job.gpus_per_node < job.gpus:
            n = job.gpus // job.gpus_per_node
            return (
                "gang-shape",
                f"{free} GPUs free, but not {n} nodes with {job.gpus_per_node} each",
            )
        if job.gpus <= self.cluster.max_node_gpus:
            return "fragmented", f"{free} GPUs free, but no single node has {job.gpus} free"
        return "constraints", f"{free} GPUs free, but none in a shape that meets its constraints"

    def next_wakeup(self) -> float | None:
        """When the adapter should call :meth:`schedule` even if nothing happens: a pre-emption
        victim passes its minimum run time then."""
        return None if self._wake == math.inf else self._wake

    def pending_jobs(self, now: float) -> list[Job]:
        """Pending jobs in priority order."""
        return [self.jobs[j] for j in self.pending.ordered(lambda j: self._key(j, now))]


def _holder(job_id: str) -> str:
    return f"{job_id}\0claim"
