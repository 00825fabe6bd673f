"""Pre-emption as the scheduler carries it out: victims are signalled, and the GPUs (and CPUs
and memory) they free are *claimed* for the pre-empting job, which starts once all its victims
have gone, or sooner where GPUs free elsewhere meanwhile (a pass finds the place, and
:meth:`Preemptions.started_elsewhere` ends the claim). Victim choice itself is
:mod:`.preemption`.

:class:`Preemptions` is the :class:`~jupyter_gpusched.core.scheduler.Scheduler`'s collaborator
for it: it keeps the claims, and is given what it reads (the cluster state, the queue tree, the
running jobs and their :class:`~.ledger.RunningLedger`), the :class:`~.agenda.Agenda` it notes
decisions and work on, and the scheduler's bookkeeping steps it calls (set a job's reason,
one-leaf patience). It starts no job itself: :meth:`Preemptions.hand_over` returns the owner
of a claim that is whole, and the scheduler starts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import reasons
from .admission import under_guarantee
from .decisions import Preempt
from .jobs import Job, JobState, Reason
from .preemption import VictimSearch, find_victims
from .state import Part, Placement

if TYPE_CHECKING:
    from .agenda import Agenda
    from .ledger import RunningLedger
    from .policies import Policy
    from .priority import PriorityKeys
    from .quotas import QueueTree
    from .settings import PolicySettings
    from .state import ClusterState


@dataclass
class Claim:
    """GPUs promised to a pre-empting job: it starts when ``waiting`` is empty. ``short`` is
    what the claim does not hold yet, per node: [GPU mask, CPUs, memory]."""

    placement: Placement
    waiting: set[str] = field(default_factory=set)
    short: dict[int, list] = field(default_factory=dict)


def holder(job_id: str) -> str:
    """The name under which a claim holds resources in the ClusterState."""
    return f"{job_id}\0claim"


def held_for(name: str) -> tuple[str, bool]:
    """The job a ClusterState holder name stands for, and whether it is a claim (GPUs freed for
    a pre-empting job, reserved until its victims have left)."""
    job_id, _, claim = name.partition("\0")
    return job_id, bool(claim)


@dataclass(frozen=True)
class Holding:
    """What one job holds on one node: ``reserved`` when it is a claim (freed by a victim for
    the pre-empting job ``job_id``, which starts once its other victims have gone)."""

    job_id: str
    reserved: bool
    part: Part


def holdings(state, node: int) -> list[Holding]:
    """Who holds GPUs, CPUs or memory on ``node`` (an index), by job id (a job's claim after
    what it runs): for adapters, which need not know how claims are named."""
    found = []
    for name in sorted(state.holders[node]):
        job_id, reserved = held_for(name)
        found.extend(
            Holding(job_id, reserved, part)
            for part in state.allocations[name].parts
            if part.node == node
        )
    return found


class Preemptions:
    def __init__(
        self,
        state: ClusterState,
        tree: QueueTree,
        settings: PolicySettings,
        policy: Policy,
        jobs: dict[str, Job],
        running: dict[str, Job],
        ledger: RunningLedger,
        agenda: Agenda,
        *,
        set_reason: Callable[[Job, Reason | None], None],
        patient: Callable[[Job, float], bool],  # may it wait for one leaf switch (.passes)
        priorities: PriorityKeys,  # (read only: which jobs are urgent, core/deadlines.py)
    ):
        self.state, self.tree, self.settings, self.policy = state, tree, settings, policy
        self.jobs, self.running, self.ledger, self.agenda = jobs, running, ledger, agenda
        self._set_reason, self._patient = set_reason, patient  # the scheduler's bookkeeping
        self.priorities = priorities
        self.claims: dict[str, Claim] = {}  # pre-empting job id -> what it was promised
        self._victims = VictimSearch(state, tree, settings, policy.topology)

    def reclaims(self, job: Job) -> bool:
        """May ``job`` take back borrowed GPUs (pre-empt tier 2 of other queues)? Only while its
        queue, and every ancestor, stays within its guarantee (invariant 4)."""
        return self.policy.guarantees and under_guarantee(job, self.tree.get(job.queue))

    def try_preempt(self, job: Job, now: float, pass_, limit_node=None, behind=False) -> bool:
        """Pre-emption is tried in priority order and stops for the rest of the pass (``pass_``,
        a :class:`~.passes.Pass`) at the first job it cannot help, or after a few successes.
        ``behind``: the job comes after the reservation (a gang there waits for one leaf)."""
        if pass_.tries <= 0 or job.refusals:  # a refused launch would stop its victims again
            return False
        attempted = self._preempt(job, now, limit_node, behind)
        if attempted is None:
            return False
        pass_.tries = pass_.tries - 1 if attempted else 0
        return attempted

    def _preempt(self, job: Job, now: float, limit_node=None, behind=False) -> bool | None:
        """Try to pre-empt for ``job``: None if there was nothing to try, else success."""
        urgent = job.id in self.priorities.urgent  # its deadline is near (core/deadlines.py)
        if (job.tier == 3 and not urgent) or job.fractional or not job.gpus:
            return None  # fractional and CPU-only jobs neither pre-empt nor are pre-empted
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        reclaim = self.policy.quotas and self.reclaims(job)
        if job.tier == 3 and not reclaim:
            return None  # an urgent tier-3 job pre-empts only to reclaim its guarantee
        if self.ledger.preemptible_gpus(reclaim) + self.state.free_for(job) < job.gpus:
            return None
        # tier-3 victims first (shorter grace, no guarantee touched); reclaim from tier 2 only
        # when tier 3 cannot make room
        found = None
        for reclaiming in (False, True) if reclaim else (False,):
            found = find_victims(
                self._victims,
                job,
                queue,
                self.running,
                self.ledger.victim_room(reclaiming),
                self.ledger.leaving_room(reclaiming),
                now,
                reclaim=reclaiming,
                limit_node=limit_node,
                one_leaf=self._patient(job, now, behind=behind),
                urgent=urgent,
            )
            if found is not None:
                break
        if found is None:
            self._wake_for_minimum_run_time(now, reclaim)
            return False
        placement, victims = found
        claim = Claim(placement, {v.id for v in victims})
        claim.short = {p.node: [p.mask, p.cpus, p.memory_gb] for p in placement.parts}
        self.claims[job.id] = claim
        self._collect(job.id, claim)
        self._account_claim(job, +1)
        for victim in victims:
            self.leaving(victim, +1)
        grace = 0.0
        for victim in victims:
            victim.preempted_by = job.id
            victim.preemptors += (job.id,)
            tier_grace = self.settings.tiers[victim.tier].grace_period
            grace = max(grace, tier_grace)
            self.agenda.decisions.append(
                Preempt(victim.id, job.id, self.settings.preemption_signal, tier_grace)
            )
        names = ", ".join(v.id for v in victims)
        self._set_reason(
            job,
            reasons.PREEMPTING.reason(now + grace, victims=names),
        )
        return True

    def _wake_for_minimum_run_time(self, now: float, reclaim: bool) -> None:
        """Ask to be called when the next possible victim passes its minimum run time."""
        for tier in (3, 2) if reclaim else (3,):
            minimum = self.settings.tiers[tier].minimum_run_time
            starts = self.ledger.recent_starts[tier]
            # started in time order: drop those past their minimum (for good: time only grows)
            while starts and (starts[0][0] + minimum <= now or starts[0][1] not in self.running):
                starts.popleft()
            if starts:
                self.agenda.wake_at(starts[0][0] + minimum)

    def _collect(self, owner: str, claim: Claim) -> None:
        """Hold for the claim whatever it still lacks that is free now: GPUs, CPUs, memory."""
        state, parts = self.state, []
        for idx, short in claim.short.items():
            mask = short[0] & state.free_mask[idx]
            cpus = min(short[1], max(state.cpu_free[idx], 0.0))
            memory = min(short[2], max(state.mem_free[idx], 0.0))
            if mask or cpus > 0 or memory > 0:
                parts.append(Part(idx, mask, cpus, memory))
                short[0] &= ~mask
                short[1] -= cpus
                short[2] -= memory
        if parts:
            state.take(holder(owner), Placement(tuple(parts)), extend=True)

    def hand_over(self, owner: str, victim_id: str) -> tuple[Job, Placement] | None:
        """A victim has gone: the claim takes what it freed. When it is whole, the claim is
        over and the owner returned with its placement, for the scheduler to start."""
        claim = self.claims[owner]
        claim.waiting.discard(victim_id)
        self._collect(owner, claim)
        if claim.waiting:
            return None
        job = self.jobs[owner]
        self._end(job)  # the scheduler starts it now: its pre-emption was not called off
        return job, claim.placement

    def started_elsewhere(self, job: Job) -> None:
        """``job``, whose victims are still leaving, starts now on GPUs freed elsewhere: its
        claim ends (the victims, already signalled, simply end)."""
        self._end(job)

    def drop(self, job: Job) -> None:
        """Call off ``job``'s pre-emption (its node went away, an admin held it...): it waits
        again, examined at the next pass."""
        if job.id not in self.claims:
            return
        if job.state == JobState.PENDING and job.reason and job.reason.detail == "preempting":
            self._set_reason(job, reasons.PREEMPTION_DROPPED.reason())
            self.agenda.new.append(job.id)
        self._end(job)

    def _end(self, job: Job) -> None:
        """Forget ``job``'s claim: give back what it holds; victims still leaving simply end."""
        claim = self.claims.pop(job.id)
        if holder(job.id) in self.state.allocations:
            self.state.release(holder(job.id))
        self._account_claim(job, -1)
        for victim_id in claim.waiting:
            victim = self.jobs[victim_id]
            if victim.preempted_by == job.id:
                victim.preempted_by = None  # already signalled; it will simply end
                self.leaving(victim, -1)
        self.agenda.freed = True

    def leaving(self, victim: Job, sign: int) -> None:
        """Count a signalled victim's GPUs as leaving its queues (guarantee checks see it gone)
        and, while it runs, its nodes (what a victim search could still free there)."""
        held = self.state.allocations.get(victim.id)
        if held is not None and victim.id in self.running:  # (an ended one: ledger.ended)
            self.ledger.signalled(victim, held, sign)
        if self.policy.quotas:
            for node in self.tree.get(victim.queue).chain():
                node.leaving += sign * victim.amount

    def _account_claim(self, job: Job, sign: int) -> None:
        queue = self.tree.get(job.queue) if self.policy.quotas else self.tree.root
        cpus, memory = sign * (job.cpus or 0.0), sign * (job.memory_gb or 0.0)
        self.tree.claim(queue, sign * job.amount, cpus, memory)
        if job.tier == 1:
            queue.tier1_running += sign * job.amount
