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

The pass itself is :mod:`.passes`. The scheduler's collaborators each own one part of the
work: :class:`~.claims.Preemptions` (claims for pre-empting jobs), :class:`~.admin.Admin` (hold,
release, priority, maintenance, restore), :class:`~.retries.LaunchRetries` (refused launches),
:class:`~.ledger.RunningLedger` (what the running jobs hold), :class:`~.priority.PriorityKeys`
(the order); what they leave for the next pass goes on the :class:`~.agenda.Agenda`.
"""

from __future__ import annotations

import math
from functools import partial

from . import deadlines, reasons
from .admin import HELD, Admin
from .admission import Capacity, rejection, validate
from .agenda import Agenda
from .cadence import BackfillCadence
from .claims import Holding, Preemptions, holdings
from .cluster import Cluster
from .deadlines import DeadlineWatch
from .decisions import Start, Stop
from .errors import ConfigError
from .fragmentation import Fragmentation
from .jobs import Job, JobState, Reason, reason_setter
from .ledger import RunningLedger
from .one_leaf import fits_one_leaf, patient_for_one_leaf
from .ordering import PendingQueue
from .passes import run_pass
from .policies import Policy, get_policy
from .priority import PriorityKeys
from .quotas import QueueTree
from .reservation import Reservation
from .retries import LaunchRetries
from .runtime_estimates import RuntimeEstimates
from .settings import PolicySettings
from .state import ClusterState, Placement
from .workload import Workload


class Scheduler:
    def __init__(
        self,
        cluster: Cluster,
        queues: QueueTree | None = None,
        settings: PolicySettings | None = None,
        policy: Policy | str = "gpusched",
        tally_by_class: bool = False,  # keep pending_gpus_by_class (a replay's class table)
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
        urgency = self.policy.deadlines == "urgency" and self.policy.order == "priority"
        self.pending = PendingQueue(
            self._key,
            self.policy.order != "arrival",
            node_gpus=cluster.max_node_gpus,
            urgent=self.priorities.is_urgent if urgency else None,
        )
        self.deadlines = DeadlineWatch(
            self.policy.deadlines if urgency or self.policy.deadlines != "urgency" else "ignore",
            self.settings.deadline_urgency,
        )
        self.pending_gpus_by_reason = {"capacity": 0, "placement": 0, "policy": 0}
        self.pending_gpus_by_class = {} if tally_by_class else None  # by (tier, queue, kind)
        # the bookkeeping steps the collaborators are given too: none holds the scheduler (no
        # reference cycle: a scheduler let go of is freed at once, with all its jobs)
        self._set_reason = reason_setter(self.pending_gpus_by_reason, self.pending_gpus_by_class)
        self.runtime_estimates = RuntimeEstimates.from_settings(self.settings)
        self._walltime = partial(self.runtime_estimates.frozen_plan, self.settings)
        self.reservation: Reservation | None = None
        # a deep pass leaves out the lists behind the reservation that cannot start (see
        # .left_out); False: it examines every job, the reference the tests compare with
        self.leave_out_lists = True
        self.lists_left_out = 0  # in all passes (for tests and benchmarks)
        self.tier_first = self.policy.order not in ("arrival", "multifactor")
        self.passes = 0
        self._stopping: set[str] = set()
        self.retries = LaunchRetries(self.settings)  # refused launches waiting to be retried
        self.agenda = Agenda()  # what the next schedule() looks at and hands out
        self._last_deep = -math.inf
        self.cadence = BackfillCadence.of(self.settings, self.policy)  # deep passes' interval
        self._deep_due = False
        self._capacity = Capacity(cluster)
        leaf_gpus = max(
            sum(cluster.nodes[i].gpus for i in members) for members in cluster.leaves.values()
        )
        self._patient = partial(
            patient_for_one_leaf, self.policy, cluster, self.settings, leaf_gpus
        )
        self._fits_one_leaf = partial(fits_one_leaf, self.policy, cluster, leaf_gpus)
        self.preemptions = Preemptions(
            self.state,
            self.tree,
            self.settings,
            self.policy,
            self.jobs,
            self.running,
            self.ledger,
            self.agenda,
            set_reason=self._set_reason,
            patient=self._patient,
            priorities=self.priorities,
        )
        self._claims = self.preemptions.claims  # the same dict: events and passes read it
        self.admin = Admin(
            cluster=cluster,
            state=self.state,
            policy=self.policy,
            tree=self.tree,
            jobs=self.jobs,
            pending=self.pending,
            priorities=self.priorities,
            maintenance=self.maintenance,
            agenda=self.agenda,
            preemptions=self.preemptions,
            set_reason=self._set_reason,
            walltime=self._walltime,
        )
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
        self._walltime(job)  # its planned run time, frozen now (runtime_estimates.frozen_plan)
        if self.state.fgd is not None and job.gpus:
            self.state.fgd.workload.observe(job)
        job.state, job.pending_since = JobState.PENDING, now
        if job.deadline is not None:
            deadlines.watch(self, job, now)
        if job.held:  # submitted on hold
            self._set_reason(job, HELD)
            return job
        self.pending.add(job, self._walltime(job))
        self.agenda.new.append(job.id)
        return job

    def cancel(self, job_id: str, now: float, why: str = "cancelled") -> Job:
        job = self.jobs[job_id]
        if job.state == JobState.PENDING:
            self.preemptions.drop(job)
            self._leave_pending(job)
            job.state, job.end_time, job.held = JobState.CANCELLED, now, False
            self.priorities.finished(job_id)
            self.agenda.freed = True  # it may have held the reservation or claimed GPUs
        elif job.state == JobState.RUNNING and job_id not in self._stopping:
            self._stopping.add(job_id)
            self.agenda.decisions.append(Stop(job_id, why))
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
        if outcome == "completed" and job_id not in self._stopping:
            self.runtime_estimates.completed(job, now)
            self.cadence.completed(now - job.start_time)
        self.ledger.ended(job, self.state.release(job_id), self._end_by_limit(job))
        self._account(job, -1, now)
        job.end_time = now
        self.agenda.freed = True
        claim_owner = job.preempted_by
        job.preempted_by = None
        if job_id in self._stopping:
            self._stopping.discard(job_id)
            job.state = JobState.CANCELLED
        elif outcome == "refused" and job.kind == "batch":
            reason = self.retries.back_off(job, now, message)
            if reason is not None:
                self._set_reason(job, reason)
                self.agenda.wake_at(job.retry_at)
        elif outcome == "preempted" and job.kind == "batch":
            job.preemptions += 1
            self._requeue(job, reasons.PREEMPTED.reason())
        elif outcome == "preempted":
            job.preemptions += 1
            job.state = JobState.PREEMPTED
        else:
            job.state = JobState.COMPLETED if outcome == "completed" else JobState.FAILED
        if job.state.finished:
            self.priorities.finished(job_id)
        if outcome != "refused":
            job.refusals = 0
        if claim_owner is not None:
            self.preemptions.leaving(job, -1)
            if claim_owner in self._claims:
                ready = self.preemptions.hand_over(claim_owner, job_id)
                if ready is not None:  # its last victim has gone: the claim is whole
                    owner, placement = ready
                    self._start(owner, placement, now)
                    self._leave_pending(owner)

    def set_node_state(self, name: str, node_state: str, now: float) -> None:
        """``drain``: no new placements, running jobs finish; ``down``: running jobs fail (batch
        jobs are requeued); ``up``: back in service."""
        node = self.cluster.node(name)
        self.state.set_node_state(node.index, node_state)
        self.reservation = None  # made again, on the nodes in service, by the next pass ...
        self.agenda.freed = True  # ... which walks the queue
        if node_state == "up":
            return
        for owner, claim in list(self._claims.items()):
            if node.index in claim.placement.nodes:  # no new placement there
                self.preemptions.drop(self.jobs[owner])
        if node_state != "down":
            return
        for job_id in sorted(self.state.holders[node.index]):
            job = self.running[job_id]
            self.agenda.decisions.append(Stop(job_id, f"node {name} is down", ended=True))
            self.job_ended(job_id, now, "failed")
            if job.kind == "batch" and job.state == JobState.FAILED:
                if job.deadline is not None:
                    # its failed run ended its urgency: watched anew, before it is queued
                    # (an urgent job is queued in a list of its own)
                    deadlines.watch(self, job, now)
                self._requeue(job, reasons.NODE_DOWN.reason(node=name))

    # -- the pass ----------------------------------------------------------------------------
    def schedule(self, now: float) -> list:
        """Run a scheduling pass if anything changed; return the decisions to carry out."""
        if now >= self.agenda.wake:
            self.agenda.wake = math.inf
            self.agenda.freed = self._deep_due = True
            if self.maintenance:
                for node_name in self.admin.maintenance_due(now):
                    self.set_node_state(node_name, "drain", now)
                self.agenda.wake = min([self.agenda.wake, *self.maintenance.values()])
            if self.retries.backing_off:
                due, later = self.retries.due(now)
                for job in due:
                    self._set_reason(job, None)
                    self.pending.add(job, self._walltime(job))
                    self.agenda.new.append(job.id)
                self.agenda.wake_at(later)
            if self.deadlines.events:
                deadlines.act(self, now)
        if self.agenda.freed or self.agenda.new:
            full, new = self.agenda.freed, self.agenda.new
            self.agenda.freed, self.agenda.new = False, []
            self.passes += 1
            if self.priorities.refresh(now, self.half_life):
                self.pending.refresh()
                # the order changed: the reservation's holder may no longer be the first
                # blocked job, and only a walk of the queue in the new order can say which is
                full = True
            previous = self.reservation
            if previous is not None and (
                full or self.jobs[previous.job_id].state != JobState.PENDING
            ):
                self.reservation = None
            if full:
                interval = self.cadence.interval
                deep = self._deep_due or now - self._last_deep >= interval
                deep = deep or not self.policy.backfill
                if deep:
                    self._last_deep, self._deep_due = now, False
                skip: set = set()
                ordered = self.pending.ordered(skip)
                stopped = run_pass(self, ordered, now, skip, deep, previous)
                if stopped and len(self.pending) > 1:  # a deep pass will look further
                    self.agenda.wake_at(self._last_deep + interval)
            # new jobs: all of them after submissions only; after a full pass, the ones it
            # stopped before reaching (so that every pending job has a reason)
            fresh = [j for j in new if j in self.jobs and self.waiting_in_line(self.jobs[j])]
            if full:
                fresh = [j for j in fresh if self.jobs[j].reason is None]
            if fresh:
                run_pass(self, sorted(fresh, key=self._key), now, None)
        out, self.agenda.decisions = self.agenda.decisions, []
        return out

    def _list_of(self, job_id: str) -> tuple:
        return self.pending.list_of(self.jobs[job_id])

    @staticmethod
    def waiting_in_line(job: Job) -> bool:
        """Pending and neither held nor waiting out a refused launch's back-off."""
        return job.state == JobState.PENDING and not job.held and job.retry_at is None

    # -- what an admin does (see .admin) --------------------------------------------------------
    def hold(self, job_id: str, now: float) -> Job:
        """See :meth:`.Admin.hold`."""
        return self.admin.hold(job_id, now)

    def release(self, job_id: str, now: float) -> Job:
        """See :meth:`.Admin.release`."""
        return self.admin.release(job_id, now)

    def set_priority(self, job_id: str, priority: int, now: float) -> Job:
        """See :meth:`.Admin.set_priority`."""
        return self.admin.set_priority(job_id, priority, now)

    def set_maintenance(self, node_name: str, start: float | None, now: float) -> None:
        """See :meth:`.Admin.set_maintenance`."""
        self.admin.set_maintenance(node_name, start, now)

    def restore(self, job: Job, placement: Placement, now: float) -> Job:
        """See :meth:`.Admin.restore`."""
        self._start(self.admin.restore(job, placement, now), placement, now, restored=True)
        if job.deadline is not None:
            deadlines.watch(self, job, now)  # its deadline is still watched
        return job

    def forget(self, job_id: str) -> None:
        """See :meth:`.Admin.forget`."""
        self.admin.forget(job_id)

    def position(self, job_id: str) -> int | None:
        """See :meth:`.Admin.position`."""
        return self.admin.position(job_id)

    def update_quotas(self, tree: QueueTree, now: float) -> None:
        """Take the guarantees, limits, weights, members and user limits of ``tree`` (built
        from an edited queue file with the same queues). Running jobs are not touched; the new
        figures apply from the next pass."""
        self.tree.adopt(tree)
        self.half_life = self.tree.half_life or self.settings.fair_share_half_life
        self.priorities.recompute_soon()  # fair share (and the keys) at the next pass
        self.reservation = None
        self.agenda.freed = True

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
        self.ledger.started(job, placement, self._end_by_limit(job), protected)
        self._account(job, +1, now)
        if not restored:
            self.agenda.decisions.append(Start(job.id, placement))

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

    def _end_by_limit(self, job: Job) -> float:
        """When the reservation plans running ``job`` to end: at its walltime, else the policy's
        default. Never at a learned estimate, which plans only jobs that wait
        (:mod:`.runtime_estimates`)."""
        return job.start_time + self.settings.walltime(job)

    def planned_run_time(self, job: Job) -> float:
        """How long the engine plans ``job`` to run: its walltime, the policy default or a
        learned estimate (:mod:`.runtime_estimates`)."""
        return self._walltime(job)

    def next_wakeup(self) -> float | None:
        """When the adapter should call :meth:`schedule` even if nothing happens: a pre-emption
        victim passes its minimum run time then."""
        return None if self.agenda.wake == math.inf else self.agenda.wake

    def next_deep_pass(self) -> float:
        """When the next deep pass comes at the latest (one ``cadence.interval`` after the last;
        sooner when something wakes the engine)."""
        return self._last_deep + self.cadence.interval

    def holdings(self, node: int) -> list[Holding]:
        """Who holds what on node ``node`` (an index): running jobs and pre-emption claims."""
        return holdings(self.state, node)

    def retrying_jobs(self) -> list[Job]:
        """Pending jobs waiting out a back-off after a refused launch (see :mod:`.retries`)."""
        return self.retries.waiting()

    def pending_jobs(self, now: float) -> list[Job]:
        """Pending jobs in priority order."""
        return [self.jobs[j] for j in self.pending.ordered()]
